"""Machinery shared by every adapter sidecar: config, transport classifier, compile helpers,
the generic gRPC servicer and the server process."""
