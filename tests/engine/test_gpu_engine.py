"""The engine on a GPU: the Triton fast path gives the reference backend's tokens.
Runs where CUDA is present (the GPU machine); skipped on the CPU."""
import random

import pytest
import torch

from parashift import LLM, SamplingParams
from tests.conftest import requires_smollm2

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engines():  # SmolLM2: every test that takes these is marked requires_smollm2
    return {backend: LLM(device="cuda", dtype="float32", attention_backend=backend,
                         gpu_memory_utilization=0.3) for backend in ("torch", "triton")}


@requires_smollm2
def test_default_model_answers_on_gpu(engines):
    out = engines["triton"].chat(QUESTION, SamplingParams(temperature=0, max_tokens=32))
    assert out[0].outputs[0].text == "The capital of France is Paris."


@requires_smollm2
def test_triton_matches_torch_backend(engines):
    rng = random.Random(0)
    prompts = [[rng.randrange(49152) for _ in range(rng.randint(1, 700))] for _ in range(24)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)
    outs = {b: llm.generate(prompts, params) for b, llm in engines.items()}
    for ref, fast in zip(outs["torch"], outs["triton"]):
        assert fast.outputs[0].token_ids == ref.outputs[0].token_ids
        for got, want in zip(fast.outputs[0].logprobs, ref.outputs[0].logprobs):
            assert max(abs(got[t] - want[t]) for t in got.keys() & want.keys()) < 2e-3


@requires_smollm2
def test_lone_sequences_match_torch_backend(engines):
    """One sequence at a time (decodes of many splits: the preloading kernel's, RoPE and the
    KV write in it) gives the torch backend's tokens."""
    rng = random.Random(2)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)
    for length in (1, 100, 700):
        prompt = [[rng.randrange(49152) for _ in range(length)]]
        ref, fast = (engines[b].generate(prompt, params)[0].outputs[0] for b in ("torch",
                                                                             "triton"))
        assert fast.token_ids == ref.token_ids
        for got, want in zip(fast.logprobs, ref.logprobs):
            assert max(abs(got[t] - want[t]) for t in got.keys() & want.keys()) < 2e-3


def _record_replays(monkeypatch) -> list:
    """The buckets of the graphs replayed from here on, in order."""
    from parashift.worker.cuda_graphs import StepGraphs
    replayed, run = [], StepGraphs.run
    monkeypatch.setattr(StepGraphs, "run", lambda self, chunks, tables, plan, bucket, *a, **k:
                        replayed.append(bucket) or run(self, chunks, tables, plan, bucket, *a, **k))
    return replayed


def _eager_and_graph_tokens(vocab: int, **engine_options) -> dict[bool, list[list[int]]]:
    """13 prompts of 1-300 random ids, 16 greedy tokens each, eager (False) and with CUDA
    graphs and async scheduling (True); a fixed KV pool (the module's other engines may
    hold most of the memory budget)."""
    rng = random.Random(1)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 300))] for _ in range(13)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = {}
    for fast in (False, True):
        llm = LLM(device="cuda", kv_cache_memory=1 << 30, cuda_graphs=fast,
                  async_scheduling=fast, max_num_seqs=16, **engine_options)
        outs[fast] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        del llm
    return outs


@pytest.mark.parametrize("step_tokens", [None, 512])
def test_graphs_and_async_scheduling_give_the_eager_tokens(step_tokens, monkeypatch, tmp_path):
    """Fast path (CUDA graphs, async scheduling) against eager, one step at a time; steps
    that prefill replay mixed graphs (with a 512-token budget, chunks of long prompts beside
    decodes). A tiny random model: no download, nothing to carry. In float32: in bfloat16
    a graph's padded rows change the GEMMs' kernels and this model's near ties flip (decode
    graphs alone: 11 of 13 sequences equal eager's; docs/benchmark_log.md)."""
    from tests.engine.conftest import save_tiny_llama
    model_dir = save_tiny_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2,
                                hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    replayed = _record_replays(monkeypatch)
    outs = _eager_and_graph_tokens(512, model=model_dir, dtype="float32",
                                   skip_tokenizer_init=True, max_num_batched_tokens=step_tokens)
    assert outs[True] == outs[False]
    assert any(b.decode for b in replayed) and any(not b.decode for b in replayed)


def test_wide_mixed_graphs_give_the_eager_tokens(monkeypatch, tmp_path):
    """Wide mixed buckets (PARASHIFT_MIXED_GRAPH_WIDE_SEQS; narrow buckets of 4 sequences
    here, wide ones of 16 from 512 rows): steps that prefill beside more decodes than a
    narrow bucket holds replay them, with the eager tokens (the narrow buckets' own steps:
    test_graphs_and_async_scheduling_give_the_eager_tokens)."""
    from parashift.worker import cuda_graphs
    from tests.engine.conftest import save_tiny_llama
    monkeypatch.setattr(cuda_graphs, "MIXED_SEQS", 4)
    monkeypatch.setattr(cuda_graphs, "WIDE_SEQS", 16)
    model_dir = save_tiny_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2,
                                hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    replayed = _record_replays(monkeypatch)
    outs = _eager_and_graph_tokens(512, model=model_dir, dtype="float32",
                                   skip_tokenizer_init=True, max_num_batched_tokens=512)
    assert outs[True] == outs[False]
    assert any(b.seqs == 16 and not b.decode for b in replayed)


@requires_smollm2
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphs_give_the_eager_tokens_on_the_default_model(dtype):
    """The same on SmolLM2 (its GGUF carried: README, "GPU runs"), in both dtypes: its
    logits are far from the near ties of a random model (passed with decode graphs before
    steps that prefill replayed graphs too; not yet run since)."""
    outs = _eager_and_graph_tokens(49152, dtype=dtype)
    assert outs[True] == outs[False]


def test_penalties_bias_and_samples_on_gpu_give_the_cpu_tokens(tmp_path):
    """The sampler's batched penalties, logit bias and parallel samples, under CUDA graphs
    and async scheduling, against the CPU (a tiny random model, float32, greedy)."""
    from tests.engine.conftest import save_tiny_llama
    model_dir = save_tiny_llama(tmp_path, num_attention_heads=8, num_key_value_heads=4,
                                hidden_size=96, intermediate_size=192, num_hidden_layers=3)
    rng = random.Random(2)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(1, 60))] for _ in range(9)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, n=2,
                            presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2,
                            logit_bias={5: 3.0, 7: -100.0})
    outs = {}
    for device in ("cpu", "cuda"):
        with LLM(model_dir, device=device, dtype="float32", skip_tokenizer_init=True,
                 gpu_memory_utilization=0.3) as llm:
            outs[device] = llm.generate(prompts, params)
    for cpu, gpu in zip(outs["cpu"], outs["cuda"]):
        assert [c.token_ids for c in gpu.outputs] == [c.token_ids for c in cpu.outputs]
        assert all(7 not in c.token_ids for c in gpu.outputs)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_verification_steps_replay_small_graphs_with_the_plain_tokens(monkeypatch, tmp_path,
                                                                       async_scheduling):
    """Speculative decoding with CUDA graphs, one step at a time and scheduled ahead:
    verification steps (k + 1 rows a sequence) replay the small mixed buckets and give the
    tokens of eager decoding without speculation. The drafts are the eager tokens with every third one wrong, so steps
    accept some and reject some (a random model's output gives an n-gram lookup nothing)."""
    from tests.engine.conftest import save_tiny_llama
    model_dir = save_tiny_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2,
                                hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    replayed = _record_replays(monkeypatch)
    rng = random.Random(2)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(3, 200))] for _ in range(9)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    common = dict(model=model_dir, dtype="float32", skip_tokenizer_init=True, device="cuda",
                  kv_cache_memory=1 << 30, max_num_seqs=16)
    llm = LLM(cuda_graphs=False, **common)
    eager = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    del llm
    full = [list(p) + list(out) for p, out in zip(prompts, eager)]

    def draft(tokens, room):
        ref = next(f for f, p in zip(full, prompts) if list(tokens[:len(p)]) == p)
        ahead = ref[len(tokens):len(tokens) + room]
        return [t if (len(tokens) + i) % 3 else (t + 1) % 512 for i, t in enumerate(ahead)]

    llm = LLM(cuda_graphs=True, **common, async_scheduling=async_scheduling,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    proposer = llm.llm_engine.speculator.proposer
    proposer.propose_all = lambda items: [draft(tokens, room) for _, tokens, room in items]
    spec = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    stats = llm.llm_engine.spec_decode_stats()
    del llm
    assert spec == eager
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert any(not b.decode and b.rows <= 128 for b in replayed)


def test_draft_model_graphs_give_the_eager_drafts(monkeypatch, tmp_path):
    """A draft model replaying its own CUDA graphs beside the target's: it proposes what
    it proposes eagerly, and the output is the eager output without speculation. The
    draft is the target's own model, so most drafts are accepted (a broken graph would
    show as rejections)."""
    from parashift.spec_decode import draft_model
    from tests.engine.conftest import save_tiny_llama
    model_dir = save_tiny_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2,
                                hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    rng = random.Random(3)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(3, 200))] for _ in range(9)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    common = dict(model=model_dir, dtype="float32", skip_tokenizer_init=True, device="cuda",
                  kv_cache_memory=1 << 30, max_num_seqs=16, gpu_memory_utilization=0.3)
    with LLM(cuda_graphs=False, **common) as llm:
        plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    runs = {}
    for graphs in (False, True):
        monkeypatch.setattr(draft_model, "DRAFT_GRAPHS", graphs)
        llm = LLM(cuda_graphs=True, **common, speculative_config={
            "method": "draft_model", "model": model_dir, "num_speculative_tokens": 3})
        proposer = llm.llm_engine.speculator.proposer
        assert (proposer.executor.runner.graphs is not None) == graphs
        proposals, propose_all = [], proposer.propose_all
        proposer.propose_all = lambda items: proposals.append(propose_all(items)) or proposals[-1]
        outputs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        runs[graphs] = (outputs, proposals, llm.llm_engine.spec_decode_stats())
        del llm
    for outputs, _, stats in runs.values():
        assert outputs == plain
        assert stats.num_accepted_tokens > 0.8 * stats.num_draft_tokens
    assert runs[True][1] == runs[False][1]
