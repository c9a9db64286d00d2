"""The soak's short form (scripts/soak.py, `make soak`): a `-dp 2` CPU server on the
embedded SmolLM2 under the whole traffic mix (a warm-up of every kind, then 18 s of
traffic), then every check of the long run: each request answered, KV blocks free, no
process grown, no descriptor or thread leaked, no zombie, a clean stop. One worker is killed
6 s in where the server heals (it has --max-worker-restarts), so that the traffic after its
recovery is checked too; otherwise a kill would only cost a group for good."""
from parashift.bench.soak.config import SoakConfig
from parashift.bench.soak.report import render
from parashift.bench.soak.requests import MIX
from parashift.bench.soak.runner import run_soak
from parashift.bench.soak.server import can_heal
from tests.conftest import requires_smollm2


@requires_smollm2
def test_a_short_soak_leaves_nothing_behind(tmp_path):
    heal = can_heal()
    config = SoakConfig(duration_s=18, warmup_s=8, concurrency=4, num_blocks=32,
                        max_model_len=512, kill_every_s=6 if heal else 0, max_kills=1,
                        request_timeout_s=120, sample_every_s=5, out_dir=str(tmp_path))
    record = run_soak(config)
    report = render(record)
    assert record["verdict"]["passed"], report
    assert {outcome["kind"] for outcome in record["outcomes"]} == set(MIX), report
    assert sum(o["status"] == "completed" for o in record["outcomes"]) >= 10, report
    assert len([k for k in record["kills"] if k["pid"]]) == (1 if heal else 0), report
