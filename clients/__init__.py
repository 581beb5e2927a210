"""Clients of the control plane: the `vidroute` command line and helpers for gRPC stubs."""
