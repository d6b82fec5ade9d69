"""The chat pipeline every API converts onto: met.chat.types (the internal request and the
typed output events), met.chat.pipeline (prepare, ChatRun), met.chat.parsers (output parsers)."""
