"""Protobuf at the kernel's edge: spec and capability conversion, domain errors as gRPC statuses."""
