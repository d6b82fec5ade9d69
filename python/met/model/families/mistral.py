"""Mistral 7B: Llama's layers, with a sliding window where the config sets one (read by the
loaders for every family). Its GGUF files are `llama` ones."""

from met.model.families.spec import Family

FAMILY = Family(name="mistral", hf_types=("mistral",))
