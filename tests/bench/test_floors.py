"""The benchmarks' floors count the bytes a step reads: decode reads all weights of a dense
model but the input embedding, of which it gathers a row a sequence (the whole table where the
LM head shares it); of a mixture of experts, E·(1 − (1 − k/E)^B) experts a layer for B
sequences; prefill runs k of E experts a token."""
import pytest

from parashift import LLM
from parashift.layers.fused_moe import FusedMoE
from tests.bench.benchmark_scripts import load_benchmark
from tests.helpers.tiny_configs import tiny_config


def tiny_llm(tmp_path, family: str, architecture: str):
    config = tiny_config(family)
    config.architectures = [architecture]
    config.save_pretrained(tmp_path)
    return LLM(model=str(tmp_path / "config.json"), dtype="float32", device="cpu",
               skip_tokenizer_init=True, max_model_len=64).llm_engine.runner.model


def nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def embedding_row_bytes(model) -> tuple[int, int]:
    table = model.model.embed_tokens.weight
    return table.shape[0], table[0].numel() * table.element_size()


def test_dense_model_reads_every_weight_and_a_row_of_the_embedding_a_sequence(tmp_path):
    model = tiny_llm(tmp_path, "llama-gqa-untied", "LlamaForCausalLM")
    floor = load_benchmark("decode_throughput").weight_bytes_read
    rows, row_bytes = embedding_row_bytes(model)
    every = nbytes(model.parameters())
    assert floor(model, 1) == every - (rows - 1) * row_bytes
    assert floor(model, 64) == every - (rows - 64) * row_bytes
    assert floor(model, 1, whole_embedding=True) == every


def test_a_tied_embedding_is_read_whole_as_the_lm_head(tmp_path):
    model = tiny_llm(tmp_path, "smollm2-like-tied", "LlamaForCausalLM")
    assert model.model.embed_tokens.weight is model.lm_head.weight
    floor = load_benchmark("decode_throughput").weight_bytes_read
    assert floor(model, 1) == nbytes(model.parameters())


def test_mixture_of_experts_reads_the_experts_it_touches(tmp_path):
    model = tiny_llm(tmp_path, "qwen3-moe", "Qwen3MoeForCausalLM")  # 8 experts, top-2
    floor = load_benchmark("decode_throughput").weight_bytes_read
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    experts = sum(nbytes(layer.experts.parameters()) for layer in layers)
    rows, row_bytes = embedding_row_bytes(model)
    tied = model.model.embed_tokens.weight is model.lm_head.weight
    dense = nbytes(model.parameters()) - experts
    unread_at_one_row = 0 if tied else (rows - 1) * row_bytes
    assert floor(model, 1) == pytest.approx(dense - unread_at_one_row + experts * 2 / 8)
    assert floor(model, 2) == pytest.approx(dense - unread_at_one_row + (0 if tied else row_bytes)
                                            + experts * (1 - (6 / 8) ** 2))
    assert floor(model, 1, whole_embedding=True) == pytest.approx(dense + experts * 2 / 8)

def test_prefill_floor_counts_the_experts_each_token_runs(tmp_path):
    model = tiny_llm(tmp_path, "qwen3-moe", "Qwen3MoeForCausalLM")  # 8 experts, top-2
    flops = load_benchmark("prefill_throughput").prefill_flops
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    expert_params = sum(p.numel() for layer in layers for p in layer.experts.parameters())
    dense_model_flops = flops(model, 100)
    for layer in layers:  # the same model without its experts' share
        layer.top_k = 0
    assert dense_model_flops - flops(model, 100) == pytest.approx(2 * 100 * expert_params * 2 / 8)


def test_operation_floor_takes_each_gemms_larger_of_bytes_and_flops(tmp_path):
    """At one row every GEMM is bound by its bytes (the bytes floor); at a batch past the
    matrix rate's balance each GEMM's FLOPs count instead, the other bytes as they were."""
    from parashift.layers.embedding import ParallelLMHead
    from parashift.layers.linear import LinearBase
    model = tiny_llm(tmp_path, "llama-gqa-untied", "LlamaForCausalLM")
    bench = load_benchmark("decode_throughput")
    rate = load_benchmark("prefill_throughput").BF16_MATRIX_RATE
    bandwidth, kv = 1e12, 1e6
    rows, row_bytes = embedding_row_bytes(model)
    total = nbytes(model.parameters()) - (rows - 1) * row_bytes
    assert bench.operation_floor(model, 1, kv, bandwidth) == pytest.approx((total + kv) / bandwidth)
    total = nbytes(model.parameters()) - (rows - min(rows, 1 << 20)) * row_bytes
    gemms = [m.weight for m in model.modules() if isinstance(m, (LinearBase, ParallelLMHead))]
    batch = 1 << 20  # fp32 weights: FLOPs count above rate * 4 / (2 * bandwidth) = 1,576 rows
    expected = ((total - nbytes(gemms) + kv) / bandwidth
                + sum(2 * batch * w.numel() for w in gemms) / rate)
    assert bench.operation_floor(model, batch, kv, bandwidth) == pytest.approx(expected)
