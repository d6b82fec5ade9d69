"""Anthropic Messages API: request models, conversion onto the chat pipeline, rendering."""
