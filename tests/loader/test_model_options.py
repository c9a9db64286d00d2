"""The model options of issue 18: --chat-template, --generation-config, --trust-remote-code,
and the one sentence a model directory without a tokenizer gets."""
import json
import logging
import re
import shutil

import pytest

from parashift import LLM, SamplingParams
from parashift.loader.chat_template import load_chat_template
from parashift.loader.source import load_hf_config, resolve_model
from tests.engine.conftest import save_tiny_llama

pytestmark = pytest.mark.usefixtures("single_torch_thread")
OPTIONS = dict(device="cpu", dtype="float32", num_blocks=32, enable_prefix_caching=False)
WORDS = ["<unk>", "<s>", "</s>", "hello", "world", "user", "assistant", "says", ":"]
ECHO_TEMPLATE = "{% for m in messages %}{{ m['role'] }} says {{ m['content'] }} {% endfor %}"
GENERATION = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 3,
              "do_sample": True}


def save_word_tokenizer(directory) -> None:
    """A whitespace word-level tokenizer over WORDS, saved the HF way (no chat template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, "<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(directory)


@pytest.fixture(scope="module")
def bare_dir(tmp_path_factory):
    """A tiny Llama checkpoint with neither tokenizer nor generation config."""
    directory = tmp_path_factory.mktemp("bare")
    save_tiny_llama(directory)
    (directory / "generation_config.json").unlink()
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, bare_dir):
    """The tiny checkpoint with a tokenizer and a generation config."""
    directory = tmp_path_factory.mktemp("model")
    shutil.copytree(bare_dir, directory, dirs_exist_ok=True)
    save_word_tokenizer(directory)
    (directory / "generation_config.json").write_text(json.dumps(GENERATION))
    return directory


def test_directory_without_tokenizer_gets_one_sentence(bare_dir):
    with pytest.raises(ValueError) as error:
        LLM(str(bare_dir), **OPTIONS)
    message = str(error.value)
    assert "\n" not in message and "has no tokenizer" in message
    assert "tokenizer.json" in message and "--tokenizer" in message
    assert "--skip-tokenizer-init" in message
    LLM(str(bare_dir), skip_tokenizer_init=True, **OPTIONS).shutdown()  # what it advises


def test_chat_template_inline_or_from_a_file(model_dir, tmp_path):
    template_file = tmp_path / "echo.jinja"
    template_file.write_text(ECHO_TEMPLATE)
    for value in (ECHO_TEMPLATE, str(template_file)):
        with LLM(str(model_dir), chat_template=value, **OPTIONS) as llm:
            ids = llm.llm_engine.apply_chat_template([{"role": "user", "content": "hello"}])
            assert ids == llm.get_tokenizer().encode("user says hello")
    with LLM(str(model_dir), **OPTIONS) as llm:  # this tokenizer has none of its own
        with pytest.raises(ValueError, match="no chat template"):
            llm.llm_engine.apply_chat_template([{"role": "user", "content": "hello"}])


@pytest.mark.parametrize("value, message", [
    ("no/such/template.jinja", "neither a file nor a Jinja template"),
    ("{% for m in messages %}", "not a valid Jinja template"),
])
def test_bad_chat_template_is_refused_at_start_up(value, message):
    with pytest.raises(ValueError, match=message):
        load_chat_template(value)


def test_generation_config_gives_the_request_defaults(model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="parashift"):
        llm = LLM(str(model_dir), **OPTIONS)
    logged = [r.getMessage() for r in caplog.records if "generation config" in r.getMessage()]
    assert len(logged) == 1 and "'temperature': 0.6" in logged[0]
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == \
        (0.6, 0.9, 20, 3)
    assert params.min_p == SamplingParams().min_p  # not in the file: SamplingParams' own
    output = llm.generate([[3, 4, 3, 4]])[0].outputs[0]  # no params: the model's defaults
    assert len(output.token_ids) == 3 and output.finish_reason == "length"
    llm.shutdown()


def test_generation_config_vllm_ignores_it_and_a_folder_replaces_it(model_dir, bare_dir,
                                                                    tmp_path):
    with LLM(str(model_dir), generation_config="vllm", **OPTIONS) as llm:
        assert llm.get_default_sampling_params() == SamplingParams()
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.25}))
    with LLM(str(bare_dir), skip_tokenizer_init=True, generation_config=str(tmp_path),
             **OPTIONS) as llm:
        assert llm.get_default_sampling_params() == SamplingParams(temperature=0.25)
    with pytest.raises(ValueError, match="no generation_config.json"):
        LLM(str(bare_dir), skip_tokenizer_init=True, generation_config=str(bare_dir), **OPTIONS)


def test_repetition_penalty_is_a_default_once_sampling_params_has_it(model_dir, tmp_path):
    from dataclasses import fields

    from parashift.loader.generation_config import generation_defaults
    shutil.copy(model_dir / "config.json", tmp_path / "config.json")
    (tmp_path / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.3}))
    defaults = generation_defaults(resolve_model(tmp_path))
    has_field = "repetition_penalty" in {f.name for f in fields(SamplingParams)}
    assert defaults == ({"repetition_penalty": 1.3} if has_field else {})


CUSTOM_CONFIG = '''
from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny-custom"
'''


def test_trust_remote_code_runs_the_directory_s_config_code(bare_dir, tmp_path):
    config = json.loads((bare_dir / "config.json").read_text())
    config.update(model_type="tiny-custom",
                  auto_map={"AutoConfig": "configuration_tiny.TinyCustomConfig"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "configuration_tiny.py").write_text(CUSTOM_CONFIG)
    with pytest.raises(ValueError, match="--trust-remote-code"):
        load_hf_config(resolve_model(tmp_path))
    loaded = load_hf_config(resolve_model(tmp_path), trust_remote_code=True)
    assert type(loaded).__name__ == "TinyCustomConfig" and loaded.num_hidden_layers == 2


@pytest.mark.parametrize("trust", [False, True])
def test_trust_remote_code_reaches_the_tokenizer(model_dir, monkeypatch, trust):
    import transformers

    from parashift.loader.tokenizer import load_tokenizer
    seen = {}
    real = transformers.AutoTokenizer.from_pretrained

    def recording(path, **kwargs):
        seen.update(kwargs)
        return real(path, **kwargs)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", recording)
    load_tokenizer(resolve_model(model_dir), trust_remote_code=trust)
    assert seen["trust_remote_code"] is trust


def test_generate_command_takes_the_defaults_and_prints_the_loading_lines(model_dir, tmp_path,
                                                                        capsys):
    from parashift.cli import main
    out = tmp_path / "out.jsonl"
    for flags, tokens in (([], 3), (["--max-tokens", "2"], 2)):  # the config's 3, then the flag
        main(["generate", "--model", str(model_dir), "--device", "cpu", "--num-blocks", "32",
              "--ignore-eos", "--output-file", str(out), *flags, "hello world"])
        assert len(json.loads(out.read_text())["token_ids"]) == tokens
    err = capsys.readouterr().err
    size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 2**20
    assert f"Loading {model_dir.name} (safetensors, {size:,.0f} MiB) on cpu ..." in err
    assert re.search(rf"Loaded {model_dir.name} in \d+\.\d s", err)
    assert "Request defaults from the model's generation config" in err
