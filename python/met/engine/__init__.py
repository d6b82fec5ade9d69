"""The engine: one thread runs scheduler ticks; callers add and abort requests from anywhere."""
