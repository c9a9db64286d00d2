"""What the command line prints: help that states each default once, and one line (no
traceback) for a model parashift cannot serve."""
import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parashift.cli import build_parser, main
from tests.engine.conftest import save_tiny_llama

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [["generate"], ["plan"], ["serve"], ["bench", "serve"], ["bench", "throughput"]]


def subparser(argv: list[str]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in argv:
        choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = choices.choices[name]
    return parser


def help_entries(text: str) -> dict[str, str]:
    """Each option's help entry (its lines joined), by its first option string."""
    entries, current = {}, None
    for line in text.splitlines():
        option = re.match(r"^  (-[^\s,]+)", line)
        if option:
            current = option.group(1)
            entries[current] = line
        elif current and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def shows_a_default(action: argparse.Action) -> bool:
    """An option that takes a value and has one when not given (not None, not empty)."""
    return action.nargs != 0 and action.default not in (None, [], argparse.SUPPRESS)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_help_states_each_default_once(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv + ["--help"])
    text = capsys.readouterr().out
    assert "(default: None)" not in text
    entries = help_entries(text)
    options = [a for a in subparser(argv)._actions if a.option_strings and a.dest != "help"]
    assert options and all(a.option_strings[0] in entries for a in options)
    for action in options:
        entry = entries[action.option_strings[0]]
        said = len(re.findall(r"\bdefault\b", entry, re.IGNORECASE))
        if shows_a_default(action):
            assert said == 1 and str(action.default) in entry, entry
        else:
            assert said <= 1, entry


def test_serve_help_shows_the_server_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    entries = help_entries(capsys.readouterr().out)
    assert "(default: 8000)" in entries["--port"]
    assert "(default: info)" in entries["--log-level"]
    assert "(default: auto)" in entries["--generation-config"]


@pytest.fixture(scope="module")
def unservable_models(tmp_path_factory) -> dict[str, Path]:
    from transformers import GPT2Config
    gpt2 = tmp_path_factory.mktemp("gpt2")
    GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]) \
        .save_pretrained(gpt2)
    no_tokenizer = Path(save_tiny_llama(tmp_path_factory.mktemp("no_tokenizer")))
    return {"architecture": gpt2, "tokenizer": no_tokenizer}


@pytest.mark.parametrize("problem, says", [
    ("architecture", r"unsupported model architecture \['GPT2LMHeadModel'\]; supported: "
                     r"\['LlamaForCausalLM', .*'Qwen3ForCausalLM'.*\]"),
    ("tokenizer", r"has no tokenizer \(none of tokenizer\.json, .*\): add one, name another "
                  r"with --tokenizer, or pass --skip-tokenizer-init"),
])
def test_serve_says_what_is_wrong_with_a_model_in_one_line(unservable_models, problem, says):
    run = subprocess.run([sys.executable, "-m", "parashift.cli", "serve",
                          str(unservable_models[problem]), "--device", "cpu"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parashift serve: error: "), run.stderr
    assert re.search(says, lines[0]), lines[0]
