"""`speculative_config`: vLLM's keys, validated; unknown keys and methods are errors."""
import argparse

import pytest

from parashift.config import EngineConfig
from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args
from parashift.spec_decode import PROPOSERS
from parashift.spec_decode.config import METHODS, SpeculativeConfig


def test_every_method_has_a_registered_proposer():
    assert set(PROPOSERS) == set(METHODS) == {"ngram", "suffix", "draft_model"}


@pytest.mark.parametrize("given", [{"method": "ngram", "num_speculative_tokens": 3},
                                   '{"method": "ngram", "num_speculative_tokens": 3}'])
def test_a_dict_or_its_json(given):
    config = EngineConfig(speculative_config=given).speculative_config
    assert config == SpeculativeConfig(method="ngram", num_speculative_tokens=3)


@pytest.mark.parametrize("given, message", [
    ({"method": "medusa"}, "method must be one of"),
    ({"method": "ngram", "lookahead": 2}, "unknown key"),
    ({"method": "ngram", "model": "x"}, "do not apply to method 'ngram'"),
    ({"method": "suffix", "prompt_lookup_max": 3}, "do not apply to method 'suffix'"),
    ({"method": "draft_model"}, "needs 'model'"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
    ({"prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min must be <="),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 2}, "min_token_prob"),
    ("{not json", "not valid JSON"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_configs_are_errors(given, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(speculative_config=given)


def test_async_scheduling_composes():
    """Asked for, it runs with speculation (a drafting sequence waits for its tokens:
    tests/engine/test_spec_decode_async.py); left unset, it is off with speculation."""
    from parashift.engine.node import async_scheduling
    from parashift.parallel.plan import Plan
    plans = [Plan.parse("tp1")]
    for asked, expected in ((True, True), (False, False), (None, False)):
        config = EngineConfig(speculative_config={"method": "ngram"}, async_scheduling=asked)
        assert config.speculative_config.method == "ngram"
        assert async_scheduling(config, plans) is expected


def test_the_cli_flag():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--speculative-config",
                              '{"method": "suffix", "num_speculative_tokens": 6}'])
    config = engine_config_from_args(args).speculative_config
    assert (config.method, config.num_speculative_tokens) == ("suffix", 6)
    assert engine_config_from_args(parser.parse_args([])).speculative_config is None


def test_the_bench_reads_acceptance_from_the_servers_metrics():
    from parashift.bench.server_metrics import parse_sample, spec_decode_summary
    from parashift.metrics import ServerMetrics
    from prometheus_client import generate_latest
    from types import SimpleNamespace

    metrics = ServerMetrics("m")
    stats = SimpleNamespace(num_preemptions=0, num_swapped_out=0, num_swapped_in=0,
                            swap_bytes_out=0, swap_bytes_in=0, num_recompute_tokens=0,
                            num_running=0, num_waiting=0, num_free_blocks=1,
                            num_total_blocks=1, swap_tokens_used=0, spec_decode_num_drafts=2,
                            spec_decode_num_draft_tokens=8, spec_decode_num_accepted_tokens=4)
    metrics.record_step(stats, [])
    first = parse_sample(generate_latest(metrics.registry).decode(), 0.0)
    stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens = 12, 48
    stats.spec_decode_num_accepted_tokens = 34
    metrics.record_step(stats, [])
    last = parse_sample(generate_latest(metrics.registry).decode(), 1.0)
    summary = spec_decode_summary([first, last])
    assert summary == {"num_drafts": 10, "num_draft_tokens": 40, "num_accepted_tokens": 30,
                       "acceptance_rate": 0.75, "mean_accepted_length": 4.0}
