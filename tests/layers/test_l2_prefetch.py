"""Which weight bytes are pulled into L2 where (layers/l2_prefetch.py): the plan over a step's
GEMMs, the switches (read at build and at capture, not each call), the GEMMs a Llama declares
and the blocks' points after them; on the GPU (PARASHIFT_TEST_DEVICE=cuda) an
engine's greedy tokens with the prefetches equal to those without, bf16 and FP8."""
import os

import pytest
import torch

from parashift.context import use_state
from parashift.layers import l2_prefetch
from parashift.layers.l2_prefetch import MB, Planned, budgets, plan, step_gemms
from parashift.models.llama import LlamaForCausalLM
from parashift.parallel.state import ParallelState
from tests.engine.conftest import tiny_llama_dir  # noqa: F401  (shared fixture)
from tests.helpers.switch_tokens import switch_tokens
from tests.helpers.tiny_configs import TINY

DEVICE = os.environ.get("PARASHIFT_TEST_DEVICE", "cpu")
# the 8B's FP8 weights in step order, two layers: qkv, o, gate_up, down
SIZES = [6144 * 4096, 4096 * 4096, 28672 * 4096, 4096 * 14336] * 2


def test_each_prefetch_takes_the_next_weights_from_where_the_last_stopped():
    spans = plan(SIZES, [32 * MB, 8 * MB, 8 * MB, 8 * MB] * 2)
    o, gate_up_rest = SIZES[1], 32 * MB - SIZES[1]
    assert spans[0] == [Planned(1, 0, o), Planned(2, 0, gate_up_rest)]
    assert spans[1] == [Planned(1, gate_up_rest, 8 * MB)]
    assert spans[2] == [Planned(1, 0, 8 * MB)]  # down's start
    assert spans[3] == [Planned(1, 0, 8 * MB)]  # the next layer's qkv
    assert spans[4] == spans[0]  # the next layer's the same
    assert spans[7] == []  # the step's last GEMM: nothing after it


def test_a_launch_covers_at_most_two_weights_and_whole_units():
    spans = plan([1000, 160, 160, 160, 160], [10 ** 6, 0, 0, 0, 0])
    assert spans[0] == [Planned(1, 0, 160), Planned(2, 0, 160)]
    spans = plan([64, 96, 64, 64], [90, 64, 0, 0])
    assert spans[0] == [Planned(1, 0, 80)]  # 90 rounded down to 16-byte units
    assert spans[1] == [Planned(1, 0, 64)]  # GEMM 1's own weight is never ahead of it
    spans = plan([64, 32, 96, 64], [90, 64, 0, 0])
    assert spans[0] == [Planned(1, 0, 32), Planned(2, 0, 48)]
    assert spans[1] == [Planned(1, 48, 48), Planned(2, 0, 16)]


def test_budgets_and_mode_come_from_the_switches(monkeypatch):
    names = ("qkv", "o", "gate_up", "down")
    monkeypatch.setenv(l2_prefetch.MB_ENV, "o:1.5/qkv:2")
    assert budgets(names) == dict(qkv=2 * MB, o=3 * MB // 2, gate_up=0, down=0)
    for value, expected in [("1", True), ("0", False)]:
        monkeypatch.setenv(l2_prefetch.ENV, value)
        assert l2_prefetch.enabled() is expected


@pytest.mark.parametrize("env,value", [(l2_prefetch.ENV, "2"), (l2_prefetch.ENV, "side:bulk"),
                                       (l2_prefetch.ENV, "lines"), (l2_prefetch.MB_ENV, "up:8"),
                                       (l2_prefetch.MB_ENV, "qkv=8"),
                                       (l2_prefetch.MB_ENV, "qkv:16@gate_up")])
def test_a_bad_switch_value_is_an_error_naming_it(monkeypatch, env, value):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=env):
        l2_prefetch.enabled()
        budgets(("qkv", "o"))


def tiny_llama(model_type: str = "llama"):
    from transformers import LlamaConfig
    with use_state(ParallelState.single()):
        return LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False,
                                            model_type=model_type), 512)


def test_a_llama_declares_its_gemms_in_step_order():
    model = tiny_llama()
    gemms = step_gemms(model)
    layers = model.model.layers
    assert [layer for _, _, layer in gemms] == [
        m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                        layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    assert [name for name, _, _ in gemms[:4]] == ["qkv", "o", "gate_up", "down"]
    assert [block for _, block, _ in gemms[:4]] == [layers[0].self_attn] * 2 + [layers[0].mlp] * 2
    assert l2_prefetch.weight_of(gemms[0][2]) is layers[0].self_attn.qkv_proj.weight


def test_blocks_get_points_unless_the_switch_resolves_to_0_at_build(monkeypatch):
    """No forward hooks either way; unset, the model type's default (Qwen3-MoE: off)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(l2_prefetch.ENV, raising=False)
    model = tiny_llama()  # unset: the default, on
    layers = model.model.layers
    assert l2_prefetch.attach_l2_prefetch(model) == 4 * TINY["num_hidden_layers"]
    assert layers[1].self_attn.l2_prefetch.indices == {"qkv": 4, "o": 5}
    assert layers[1].mlp.l2_prefetch.indices == {"gate_up": 6, "down": 7}
    assert not any(m._forward_hooks for m in model.modules())
    assert l2_prefetch.default_mode("qwen3_moe") == "0"
    assert l2_prefetch.attach_l2_prefetch(tiny_llama("qwen3_moe")) == 0
    monkeypatch.setenv(l2_prefetch.ENV, "1")  # set: it holds over the model's default
    assert l2_prefetch.attach_l2_prefetch(tiny_llama("qwen3_moe")) > 0
    monkeypatch.setenv(l2_prefetch.ENV, "0")
    bare = tiny_llama()
    assert l2_prefetch.attach_l2_prefetch(bare) == 0
    assert bare.model.layers[0].self_attn.l2_prefetch is l2_prefetch.NO_PREFETCHES
    monkeypatch.setenv(l2_prefetch.ENV, "sideways")
    with pytest.raises(ValueError, match=l2_prefetch.ENV):
        l2_prefetch.attach_l2_prefetch(bare)


class Recorder:
    """A StepPrefetches' stand-in: the (index, rows) of each point reached."""

    def __init__(self):
        self.calls = []

    def after(self, index, output):
        self.calls.append((index, output.shape[0]))


def test_the_mlp_calls_its_points_after_each_gemm_at_decode_rows_only():
    model = tiny_llama()
    mlp = model.model.layers[1].mlp
    recorder = Recorder()
    mlp.l2_prefetch = l2_prefetch.BlockPrefetches(recorder, {"gate_up": 6, "down": 7})
    with use_state(ParallelState.single()), torch.no_grad():
        for rows in (l2_prefetch.MAX_ROWS, l2_prefetch.MAX_ROWS + 1):
            mlp(torch.randn(rows, TINY["hidden_size"], dtype=mlp.gate_up_proj.weight.dtype))
    assert recorder.calls == [(6, l2_prefetch.MAX_ROWS), (7, l2_prefetch.MAX_ROWS)]


def test_the_switches_are_read_at_build_and_at_a_capture_not_each_call(monkeypatch):
    """Eager steps keep what the build read; a step's first GEMM under a capture reads them
    again (a graph keeps what its capture read)."""
    launched = []
    monkeypatch.setattr(l2_prefetch, "use_triton", lambda output: True)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.delenv(l2_prefetch.ENV, raising=False)
    steps = l2_prefetch.StepPrefetches(["qkv", "o"], lambda: [None, None])
    monkeypatch.setattr(steps, "launch", lambda index, text: launched.append((index, text)))
    out = torch.zeros(1, 8)
    monkeypatch.setenv(l2_prefetch.ENV, "0")
    monkeypatch.setenv(l2_prefetch.MB_ENV, "qkv:1")
    steps.after(0, out)
    steps.after(1, out)
    assert launched == [(0, "o:8"), (1, "o:8")]
    capturing[0] = True
    steps.after(0, out)
    steps.after(1, out)
    assert len(launched) == 2  # off in this capture
    monkeypatch.setenv(l2_prefetch.ENV, "1")
    steps.after(0, out)
    assert launched[-1] == (0, "qkv:1")
    capturing[0] = False
    steps.after(0, out)
    assert launched[-1] == (0, "o:8")


@pytest.fixture(scope="module")
def engine_tokens(tiny_llama_dir):  # noqa: F811
    """tokens(quantization, mode): greedy tokens with PARASHIFT_L2_PREFETCH=mode."""
    return switch_tokens(tiny_llama_dir, DEVICE, l2_prefetch.ENV)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs PARASHIFT_TEST_DEVICE=cuda")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_prefetching_engine_gives_the_same_tokens(engine_tokens, quantization, monkeypatch):
    monkeypatch.setenv(l2_prefetch.MB_ENV, "qkv:1/o:1/gate_up:1/down:1")
    assert engine_tokens(quantization, "1") == engine_tokens(quantization, "0")


def test_each_gemms_planned_spans_are_of_the_right_weights():
    weights = [torch.zeros(size, dtype=torch.uint8) for size in (96, 32, 160, 64) * 2]
    text = f"qkv:{64 / MB:.16f}/down:{48 / MB:.16f}"
    steps = l2_prefetch.StepPrefetches(["qkv", "o", "gate_up", "down"] * 2, lambda: weights)
    launched = [steps.spans_after(index, text) for index in range(len(weights))]
    by_tensor = [[(next(i for i, w in enumerate(weights) if w is s.tensor), s.first, s.count)
                  for s in spans] for spans in launched]
    assert by_tensor == [[(1, 0, 32), (2, 0, 32)], [], [], [(4, 0, 48)],
                         [(5, 0, 32), (6, 0, 32)], [], [], []]
