"""met: an LLM inference server with a C++ scheduler core."""

__version__ = "0.1.0"
