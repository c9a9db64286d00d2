"""`parashift serve` flags and the server config they build."""
import argparse

import pytest

from parashift.entrypoints.openai.cli_args import (_engine_config, add_serve_args,
                                                   server_config_from_args)
from parashift.entrypoints.openai.server_config import ServerConfig


def parse(argv):
    parser = argparse.ArgumentParser()
    add_serve_args(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_defaults_bind_loopback():
    args = parse([])
    config = server_config_from_args(args)
    assert config.host == "127.0.0.1" and config.port == 8000
    assert config.max_num_queued_requests is None and config.api_key is None


def test_server_and_engine_flags(monkeypatch):
    monkeypatch.delenv("PARASHIFT_API_KEY", raising=False)
    args = parse(["my.gguf", "--port", "9001", "--api-key", "k", "--max-num-queued-requests",
                  "5", "--shutdown-timeout", "3", "--max-request-bytes", "100",
                  "--served-model-name", "a", "b", "--max-model-len", "256"])
    config = server_config_from_args(args)
    assert (config.port, config.api_key, config.max_num_queued_requests) == (9001, "k", 5)
    assert config.served_model_names == ["a", "b"] and config.max_request_bytes == 100
    engine_config = _engine_config(args, None)
    assert engine_config.model == "my.gguf" and engine_config.max_model_len == 256


def test_model_positional_or_flag():
    assert _engine_config(parse(["--model", "x.gguf"]), None).model == "x.gguf"
    with pytest.raises(ValueError, match="two models"):
        _engine_config(parse(["y.gguf", "--model", "x.gguf"]), None)


@pytest.mark.parametrize("bad", [dict(port=70000), dict(max_request_bytes=0),
                                 dict(max_num_queued_requests=0), dict(shutdown_timeout=-1),
                                 dict(log_level="loud"), dict(api_key="")])
def test_invalid_server_config(bad):
    with pytest.raises(ValueError):
        ServerConfig(**bad)


def test_unknown_flag_is_an_error():
    with pytest.raises(SystemExit):
        parse(["--frobnicate"])
