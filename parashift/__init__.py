"""parashift: an LLM inference engine whose parallel plan is chosen per step."""
from parashift.outputs import CompletionOutput, RequestOutput
from parashift.sampling_params import SamplingParams


def _version() -> str:
    """The installed package's version; in a source tree that is not installed, the
    version pyproject.toml declares."""
    from importlib import metadata
    try:
        return metadata.version("parashift")
    except metadata.PackageNotFoundError:
        return _pyproject_version()


def _pyproject_version() -> str:
    import pathlib
    import tomllib
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


__version__ = _version()


def __getattr__(name):
    if name == "LLM":  # lazy: importing the engine pulls in transformers
        from parashift.entrypoints.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]
