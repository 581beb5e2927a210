"""Google Veo adapter sidecar, Gemini API surface (provider-apis.md §2.1, §2.3)."""
