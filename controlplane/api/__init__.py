"""gRPC boundary: servicers and the views they render.

Spec conversion and the error mapping are the kernel's (`vidroute_core.wire`).
"""
