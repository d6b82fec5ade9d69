"""OpenAI Responses API: request models, conversion onto the chat pipeline, rendering, store."""
