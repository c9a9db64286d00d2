"""Hugging Face's own load of the embedded SmolLM2-135M-Instruct GGUF in float32: the reference
of the parity tests. transformers dequantizes the GGUF in Python (~20 s of CPU), so the first
load keeps the model, pickled, in a file of the temporary folder, named by the GGUF's size and
time and the library versions; later loads (other test files, the other xdist worker) read it
back (well under a second)."""
import hashlib
import os
import tempfile
from pathlib import Path

import torch

from parashift.loader.source import embedded_gguf_path


def hf_smollm2():
    """transformers' model of the embedded GGUF, in float32, in eval mode."""
    import transformers
    path = embedded_gguf_path()
    cache = _cache_path(path, transformers.__version__)
    if cache.exists():
        return torch.load(cache, weights_only=False).eval()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    partial = cache.with_name(f"{cache.name}.{os.getpid()}.part")
    torch.save(model, partial)
    os.replace(partial, cache)  # whole or not at all: a worker may read it meanwhile
    return model


def _cache_path(gguf: Path, transformers_version: str) -> Path:
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers_version}|" \
          f"{torch.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"parashift-hf-smollm2-{digest}.pt"
