"""Structured output: generation constrained by a JSON schema, a regex, a choice or a
grammar (xgrammar), as a token bitmask applied to the logits before sampling."""
from parashift.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
