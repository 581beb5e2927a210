"""gRPC boundary: servicers, protobuf <-> domain conversion, error mapping."""
