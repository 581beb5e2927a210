"""Capability files (design 9.6): the model and loader, and the constraint language they embed."""
