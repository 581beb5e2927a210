"""Self-hosted GPU adapter sidecar (internal job API, provider-apis.md §3.4; design 9.21)."""
