"""Transport-neutral application services: what the API does, without protobuf or SQL."""
