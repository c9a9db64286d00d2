"""`parashift bench serve`'s target flags, as vLLM's `bench serve` takes them."""
import argparse

import pytest

from parashift.bench.cli import _add_serve_parser, bench_target


def target(*argv):
    parser = argparse.ArgumentParser()
    _add_serve_parser(parser.add_subparsers(dest="bench_command"))
    return bench_target(parser.parse_args(["serve", *argv]))


@pytest.mark.parametrize("argv, expected", [
    ((), ("http://127.0.0.1:8000", "completions", "/v1/completions")),
    (("--backend", "openai-chat"), ("http://127.0.0.1:8000", "chat", "/v1/chat/completions")),
    (("--backend", "openai", "--host", "10.0.0.2", "--port", "9000"),
     ("http://10.0.0.2:9000", "completions", "/v1/completions")),
    (("--backend", "vllm", "--endpoint", "/v1/completions"),
     ("http://127.0.0.1:8000", "completions", "/v1/completions")),
    (("--backend", "openai-chat", "--endpoint", "/v1/chat/completions"),
     ("http://127.0.0.1:8000", "chat", "/v1/chat/completions")),
    (("--endpoint", "/proxy/v1/chat/completions", "--base-url", "http://h:1"),
     ("http://h:1", "chat", "/proxy/v1/chat/completions")),
    (("--endpoint", "chat",), ("http://127.0.0.1:8000", "chat", "/v1/chat/completions")),
])
def test_target(argv, expected):
    assert target(*argv) == expected


@pytest.mark.parametrize("argv, message", [
    (("--backend", "openai-chat", "--endpoint", "/v1/completions"), "--backend openai-chat"),
    (("--backend", "openai", "--endpoint", "chat"), "--backend openai"),
    (("--base-url", "http://h:1", "--port", "2"), "--base-url or --host/--port"),
    (("--endpoint", "v1/completions"), "--endpoint must be a path"),
])
def test_conflicts_are_errors_naming_the_flags(argv, message):
    with pytest.raises(ValueError, match=message):
        target(*argv)


def test_an_unknown_backend_is_refused():
    with pytest.raises(SystemExit):
        target("--backend", "tgi")
