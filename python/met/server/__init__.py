"""The OpenAI-compatible HTTP server (`met serve`)."""
