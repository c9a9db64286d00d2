"""The MoE prefill path's schedule flags (kernels/moe_schedule.py) in the engine: a tiny random
Qwen3-MoE whose prompts, ten to a step, give its experts ~100 pairs each (the prefill path),
generates the same greedy tokens with every flag on as with them off at the same tiles.
Runs where CUDA is present."""
import json
import random

import pytest
import torch

from parashift import LLM, SamplingParams
from parashift.kernels import moe_prefill

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TILES = {"block_m": 32, "gate_up": [32, 32, 4, 2], "down": [64, 32, 4, 2]}


def _tokens(model_dir, tiles: dict, tmp_path, monkeypatch) -> list[list[int]]:
    path = tmp_path / f"tiles{len(tiles)}.json"
    path.write_text(json.dumps(tiles))
    monkeypatch.setenv(moe_prefill.TILES_ENV, str(path))
    rng = random.Random(5)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(80, 200))] for _ in range(10)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM(model=str(model_dir), device="cuda", dtype="bfloat16", skip_tokenizer_init=True,
             kv_cache_memory=1 << 28, max_num_batched_tokens=2048, cuda_graphs=False) as llm:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_schedule_flags_keep_the_tokens(tmp_path, monkeypatch):
    from tests.helpers.tiny_configs import save_tiny_checkpoint
    model_dir = tmp_path / "qwen3-moe"
    save_tiny_checkpoint("qwen3-moe", model_dir)
    plain = _tokens(model_dir, TILES, tmp_path, monkeypatch)
    flagged = _tokens(model_dir, {**TILES, "n_first": 1, "split_tail": 1, "tma": 1}, tmp_path,
                      monkeypatch)
    assert flagged == plain
