"""parashift: an LLM inference engine whose parallel plan is chosen per step."""
from parashift.outputs import CompletionOutput, RequestOutput
from parashift.sampling_params import SamplingParams
from parashift.version import __version__


def __getattr__(name):
    if name == "LLM":  # lazy: importing the engine pulls in transformers
        from parashift.entrypoints.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]
