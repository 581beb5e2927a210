"""The kernel both deployables share: the control plane and every adapter sidecar import it, never
each other.

What lives here is what both sides must agree on to the byte:

- `spec`, `validation`, `codec`, `hashing`: the `GenerationSpec`, its rules (design 9.4), its JSON
  form and the request hash (9.7).
- `exceptions`: the domain's exception tree; `errors`: provider error classes and the handling
  matrix (9.9).
- `capabilities`: the capability file model, its loader and the constraint language (9.6).
- `timescale`: the one time factor that compresses every duration for tests.
- `adapter`: the adapter seam's value types (plans, submit outcomes, job snapshots, recovery,
  usage, Describe), one name per concept, spoken by the sidecars and the control plane alike.
- `wire`: protobuf at the edge: spec, capability and adapter-type conversion (`wire.adapter`,
  both directions) and the domain-error -> gRPC status mapping (one interceptor for every
  server).

The pure modules import no grpc, sqlalchemy, redis or httpx; only `wire` touches protobuf.
"""
