"""The vidroute control plane: one gRPC scheduler that owns routing, fairness, leases and the
Task/Attempt/ProviderJob state machine (design 9.2).

Rooms, from the inside out: `domain` (pure rules), `persistence` (the only SQL; one unit of work),
`leases` (quota), `adapters` (the client of the sidecar seam), `scheduling` (dispatcher, upkeep,
leader, breakers), `execution` (from decision to delivered output), `storage`, `capabilities`,
`service` and `api` (transport-neutral services and thin servicers), `audit` (read-only
invariant checks). `bootstrap` is the composition root and `server` the process. Shared types
come from the kernel, `vidroute_core`; nothing here imports `adapter_sidecars`.
"""
