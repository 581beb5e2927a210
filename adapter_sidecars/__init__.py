"""Adapter sidecars: one gRPC server per provider implementing `vidroute.adapter.v1`, deployed
apart from the control plane (design 9.5).

`common` is the machinery every sidecar shares, `runway`, `veo` and `selfhosted` are the
adapters, `emulators` the provider emulators tests run against, and `contract` the shared
contract suite a new adapter must pass. Shared types come from the kernel, `vidroute_core`;
nothing here imports `controlplane`.
"""
