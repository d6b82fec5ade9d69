"""met: an LLM inference server with a C++ scheduler core."""

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from met.engine.llm import LLM
    from met.sampling import SamplingParams


def __getattr__(name: str):
    # Lazy so that `met --help` and the server's startup do not pay for importing torch up front.
    if name == "LLM":
        from met.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from met.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'met' has no attribute {name!r}")
