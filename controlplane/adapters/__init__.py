"""The control plane's one seam to provider adapter sidecars (gRPC), with a fake beside it."""
