"""Request defaults from a model's generation_config.json, as vLLM's `--generation-config`:
"auto" reads the model's own, "vllm" none, any other value is a folder holding one. Only
the values its author set (not transformers' defaults) become defaults."""
from dataclasses import fields
from pathlib import Path

from parashift.loader.source import ModelSource
from parashift.sampling_params import SamplingParams

# generation_config.json name -> SamplingParams field
GENERATION_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                     "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                     "max_new_tokens": "max_tokens"}


def generation_defaults(source: ModelSource, setting: str = "auto") -> dict:
    """SamplingParams keyword arguments the model's author recommends; {} when none."""
    folder = _folder(source, setting)
    if folder is None or not (folder / "generation_config.json").exists():
        return {}
    from transformers import GenerationConfig
    try:
        written = GenerationConfig.from_pretrained(folder).to_diff_dict()
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {folder / 'generation_config.json'}: {e}") from None
    known = {f.name for f in fields(SamplingParams)}
    return {field: written[name] for name, field in GENERATION_FIELDS.items()
            if written.get(name) is not None and field in known}


def _folder(source: ModelSource, setting: str) -> Path | None:
    if setting == "vllm":
        return None
    if setting == "auto":
        return source.path if source.kind == "hf" else None
    folder = Path(setting).expanduser()
    if not folder.is_dir():
        raise ValueError(f"generation_config must be auto, vllm or a folder holding "
                         f"generation_config.json; {setting!r} is not a folder")
    if not (folder / "generation_config.json").exists():
        raise ValueError(f"generation_config folder {setting} has no generation_config.json")
    return folder
