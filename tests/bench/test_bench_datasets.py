"""vLLM's `bench serve` dataset flags (random, sharegpt) and the one line printed when no
server answers."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from parashift.bench.datasets import random_dataset, sharegpt_dataset
from parashift.bench.workloads import WorkloadOptions, build_phases

ROOT = Path(__file__).resolve().parents[2]


class WordCounter:
    """A tokenizer stand-in: one token per word."""
    @staticmethod
    def encode(text: str) -> list[str]:
        return text.split()


def lengths(dataset, **options) -> list[tuple[int, int]]:
    (phase,) = build_phases(dataset.workload, WorkloadOptions(**options))
    return [(r.input_len, r.output_len) for r in phase.requests]


def test_random_dataset_draws_lengths_within_the_range_ratio():
    drawn = lengths(random_dataset(200, 100, 20, range_ratio=0.5))
    assert len(drawn) == 200
    assert all(50 <= i <= 150 and 10 <= o <= 30 for i, o in drawn)
    assert len({i for i, _ in drawn}) > 20  # spread, not one value
    assert lengths(random_dataset(5, 100, 20)) == [(100, 20)] * 5  # ratio 0: exact
    assert lengths(random_dataset(5, 100, 20, 0.5), seed=1) != \
        lengths(random_dataset(5, 100, 20, 0.5), seed=2)


def write_sharegpt(path: Path) -> Path:
    conversations = [
        {"conversations": [{"from": "human", "value": f"question {i} " + "word " * (4 + i)},
                           {"from": "gpt", "value": "answer " * (5 + i)}]} for i in range(6)]
    conversations.append({"conversations": [{"from": "human", "value": "too short"},
                                             {"from": "gpt", "value": "answer " * 10}]})
    conversations.append({"conversations": [{"from": "human", "value": "one turn only"}]})
    path.write_text(json.dumps(conversations))
    return path


def test_sharegpt_dataset_takes_first_turns_and_their_reply_lengths(tmp_path):
    dataset = sharegpt_dataset(str(write_sharegpt(tmp_path / "sg.json")), 100, 0, WordCounter)
    assert dataset.workload.num_requests == 6  # the short and the one-turn ones are skipped
    (phase,) = build_phases(dataset.workload, WorkloadOptions())
    dataset.fill_prompts(phase.requests)
    for request in phase.requests:
        i = int(request.prompt.split()[1])  # "question {i} word ..."
        assert request.input_len == 6 + i and request.output_len == 5 + i
    assert sorted(r.prompt for r in phase.requests) == \
        sorted(f"question {i} " + "word " * (4 + i) for i in range(6))
    capped = sharegpt_dataset(str(tmp_path / "sg.json"), 2, 0, WordCounter, output_len=9)
    assert lengths(capped) == [(i, 9) for i, _ in lengths(capped)] and len(lengths(capped)) == 2


@pytest.mark.parametrize("content, message", [("{}", "not a ShareGPT file"),
                                              ("[]", "no conversation")])
def test_sharegpt_dataset_refuses_files_without_conversations(tmp_path, content, message):
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(ValueError, match=message):
        sharegpt_dataset(str(tmp_path / "bad.json"), 10, 0, WordCounter)


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parashift.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flags", [[], ["--workload", "chat"], ["--model", "m"]])
def test_no_server_gives_one_line_naming_the_url(flags, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    run = run_cli("bench", "serve", "--base-url", url, "--output-dir", str(tmp_path), *flags)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith("parashift bench serve: no server answers at")


def test_sharegpt_needs_a_path_and_excludes_a_workload():
    assert "needs --dataset-path" in run_cli("bench", "serve", "--dataset-name",
                                             "sharegpt").stderr
    assert "not both" in run_cli("bench", "serve", "--dataset-name", "random",
                                 "--workload", "chat").stderr
