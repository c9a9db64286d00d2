"""Loaders: GGUF files (header, config, weights), shape files for random weights,
and the errors a bad model path or a damaged checkpoint gives."""
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from parashift import LLM, SamplingParams
from parashift.loader.gguf_file import read_gguf_header
from parashift.loader.gguf_loader import SUPPORTED_ARCHITECTURES, gguf_config
from parashift.loader.source import load_hf_config, resolve_model
from parashift.loader.tokenizer import load_tokenizer
from parashift.models.registry import MODEL_REGISTRY
from tests.helpers.parity import hf_greedy, hf_prompt_logits, max_relative_diff, prompt_logits
from tests.helpers.tiny_configs import save_tiny_checkpoint, tiny_hf_model
from tests.helpers.tiny_gguf import add_sentencepiece_vocab, write_tiny_gguf

pytestmark = pytest.mark.usefixtures("single_torch_thread")
SHAPES = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes"
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
OPTIONS = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, num_blocks=64,
               attention_backend="torch", enable_prefix_caching=False)


def load(model, **options) -> LLM:
    return LLM(model=str(model), **{**OPTIONS, **options})


def random_prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(length)]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_tiny_gguf(tiny_hf_model("llama-gqa-untied"), path, "llama")
    return path


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("hf")
    save_tiny_checkpoint("llama-gqa-untied", directory)
    return directory


def truncated_copy(src: Path, dst: Path, size: int) -> Path:
    dst.write_bytes(src.read_bytes()[:size])
    return dst


# ---- GGUF ---------------------------------------------------------------------

@pytest.mark.parametrize("family, arch", [("llama-gqa-untied", "llama"),
                                          ("smollm2-like-tied", "llama"),
                                          ("qwen2-qkv-bias", "qwen2"),
                                          ("qwen3-qk-norm-head-dim", "qwen3"),
                                          ("qwen3-moe-unnormalized-topk", "qwen3moe"),
                                          ("mixtral", "llama")])
def test_gguf_matches_hf(tmp_path, family, arch):
    """Q8_0 matrices, llama.cpp's q/k row order for Llama (none for Qwen), tied or not;
    experts stacked per matrix (ffn_{gate,up,down}_exps)."""
    hf = tiny_hf_model(family)
    write_tiny_gguf(hf, tmp_path / "m.gguf", arch)  # hf now holds the file's (dequantized) weights
    llm = load(tmp_path / "m.gguf")
    prompt = random_prompt(40, seed=2)
    assert max_relative_diff(prompt_logits(llm, prompt), hf_prompt_logits(hf, prompt)) < 1e-4
    assert llm.generate([prompt], GREEDY)[0].outputs[0].token_ids == hf_greedy(hf, prompt, 32)


def test_gguf_config_from_metadata(tiny_gguf):
    config = gguf_config(tiny_gguf)
    hf = tiny_hf_model("llama-gqa-untied").config
    assert config.architectures == ["LlamaForCausalLM"]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "head_dim"):
        assert getattr(config, key) == getattr(hf, key), key
    assert config.rms_norm_eps == pytest.approx(hf.rms_norm_eps)
    assert config.tie_word_embeddings is False  # the file has output.weight
    assert (config.bos_token_id, config.eos_token_id) == (1, 2)


def test_gguf_rope_scaling_from_metadata(tmp_path):
    import gguf

    def linear_rope(writer):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(4.0)
    write_tiny_gguf(tiny_hf_model("llama-gqa-untied"), tmp_path / "m.gguf", "llama",
                    extra_metadata=linear_rope)
    config = gguf_config(tmp_path / "m.gguf")
    params = getattr(config, "rope_parameters", None) or config.rope_scaling
    assert params["rope_type"] == "linear" and params["factor"] == 4.0


def test_gguf_tokenizer_matches_auto_tokenizer(tmp_path):
    """parashift asks transformers' fast tokenizer class directly (skipping AutoTokenizer's
    config parse); a SentencePiece vocabulary must come out the same."""
    from transformers import AutoTokenizer
    path = tmp_path / "spm.gguf"
    write_tiny_gguf(tiny_hf_model("llama-gqa-untied"), path, "llama", with_vocab=False,
                    extra_metadata=add_sentencepiece_vocab)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    ours = load_tokenizer(resolve_model(path))
    for text in ["hello the ab", " hello", "abc xyz!", "h\u00e9llo  a\nb"]:
        assert ours.encode(text) == reference.encode(text), text
    assert ours.encode("hello")[0] == 1  # BOS, as the file asks


def test_gguf_header_matches_gguf_reader(tiny_gguf):
    import gguf
    reader = gguf.GGUFReader(str(tiny_gguf))
    header = read_gguf_header(tiny_gguf)
    assert header.architecture == "llama"
    assert header.metadata["tokenizer.ggml.tokens"][:3] == ["<t0>", "<t1>", "<t2>"]
    assert header.metadata["parashift.test.floats"] == [0.5, -1.25]
    assert header.metadata["parashift.test.flag"] is True
    assert set(header.metadata) == set(reader.fields) - {"GGUF.version", "GGUF.tensor_count",
                                                         "GGUF.kv_count"}
    assert set(header.tensors) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        info = header.tensors[t.name]
        assert info.shape == tuple(reversed(t.shape.tolist())), t.name
        assert (info.ggml_type, info.offset, info.nbytes) == \
            (int(t.tensor_type), t.data_offset, t.n_bytes), t.name


def test_gguf_header_is_parsed_once(tiny_gguf):
    assert read_gguf_header(tiny_gguf) is read_gguf_header(tiny_gguf)


@pytest.mark.parametrize("keep", ["empty", "magic", "header", "data"])
def test_truncated_gguf_names_the_file(tiny_gguf, tmp_path, keep):
    size = tiny_gguf.stat().st_size
    keep_bytes = {"empty": 0, "magic": 6, "header": 2000, "data": size - 100}[keep]
    bad = truncated_copy(tiny_gguf, tmp_path / "bad.gguf", keep_bytes)
    with pytest.raises(ValueError, match="bad.gguf"):
        load(bad)


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip file" * 10)
    with pytest.raises(ValueError, match=r"model.gguf.*not a GGUF file"):
        load(bad)


def test_unsupported_gguf_architecture(tmp_path):
    import gguf
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(8, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'gpt2'") as error:
        load(path)
    assert all(arch in str(error.value) for arch in SUPPORTED_ARCHITECTURES)


# ---- HF directories -------------------------------------------------------------

def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load(missing)


def test_directory_without_config(tmp_path):
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(ValueError, match=r"has no config\.json") as error:
        load(tmp_path)
    assert str(tmp_path) in str(error.value)


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json"):
        load(tmp_path)


@pytest.mark.parametrize("keep", [4, 200, -100])
def test_truncated_safetensors_names_the_file(tiny_checkpoint, tmp_path, keep):
    shutil.copy(tiny_checkpoint / "config.json", tmp_path / "config.json")
    src = tiny_checkpoint / "model.safetensors"
    size = keep if keep > 0 else src.stat().st_size + keep
    truncated_copy(src, tmp_path / "model.safetensors", size)
    with pytest.raises(ValueError, match="model.safetensors"):
        load(tmp_path)


def test_directory_without_weights(tiny_checkpoint, tmp_path):
    shutil.copy(tiny_checkpoint / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        load(tmp_path)


def test_sharded_checkpoint_with_a_missing_shard(tmp_path):
    save_tiny_checkpoint("llama-gqa-untied", tmp_path, max_shard_size="100KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(FileNotFoundError, match=shards[-1].name):
        load(tmp_path)


def test_checkpoint_missing_a_tensor(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file
    tensors = load_file(tiny_checkpoint / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    shutil.copy(tiny_checkpoint / "config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match="down_proj"):
        load(tmp_path)


def test_unsupported_architecture_names_it_and_the_supported(tmp_path):
    from transformers import GPT2Config
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
               architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="GPT2LMHeadModel") as error:
        load(tmp_path)
    assert all(arch in str(error.value) for arch in MODEL_REGISTRY)


# ---- random weights from shape files ----------------------------------------------

def test_random_weights_from_tiny_shape_file():
    llm = load(SHAPES / "tiny-llama.json")
    prompt = random_prompt(20)
    first = llm.generate([prompt], GREEDY)[0].outputs[0].token_ids
    assert len(first) == 32 and all(0 <= t < 512 for t in first)
    assert load(SHAPES / "tiny-llama.json").generate([prompt], GREEDY)[0].outputs[0].token_ids \
        == first  # same seed, same weights


def test_dummy_load_format_of_a_checkpoint(tiny_checkpoint):
    llm = load(tiny_checkpoint, load_format="dummy")
    assert llm.llm_engine.runner.model.model.norm.weight.eq(1).all()  # random init, not the file
    assert len(llm.generate([random_prompt(5)], GREEDY)[0].outputs[0].token_ids) == 32


@pytest.mark.parametrize("shape_file", sorted(p.name for p in SHAPES.glob("*.json")))
def test_shape_files_parse(shape_file):
    source = resolve_model(SHAPES / shape_file)
    assert source.kind == "random"
    raw = json.loads((SHAPES / shape_file).read_text())
    if not set(raw["architectures"]) & set(MODEL_REGISTRY):
        with pytest.raises(ValueError, match=raw["architectures"][0]):
            load_hf_config(source)
        return
    config = load_hf_config(source)
    assert config.architectures == raw["architectures"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        assert getattr(config, key) == raw[key]
