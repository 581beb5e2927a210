"""Runway adapter sidecar (provider-apis.md §1)."""
