"""The `parashift` command line: generate (arguments and JSONL), plan, --help."""
import json
import pathlib
import sys

import pytest

from parashift.cli import main


def test_generate_reads_jsonl_and_writes_results(tmp_path, capsys):
    requests = tmp_path / "prompts.jsonl"
    requests.write_text(json.dumps({"prompt": "What is the capital of France?"}) + "\n" +
                        json.dumps({"messages": [{"role": "user", "content": "What is the capital "
                                                  "of France?"}]}) + "\n")
    out = tmp_path / "out.jsonl"
    main(["generate", "--device", "cpu", "--max-tokens", "16", "--input-file", str(requests),
          "--output-file", str(out)])
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in results] == ["The capital of France is Paris."] * 2
    assert all(r["finish_reason"] == "stop" for r in results)
    assert "dtype " in capsys.readouterr().err  # the dtype `auto` chose on this CPU, and why


def test_plan_prints_layout_and_groups(capsys):
    main(["plan", "--world", "6", "--sp", "3", "--tp", "2"])
    out = capsys.readouterr().out
    assert "plan sp3xtp2" in out
    assert "tp groups: [0, 1] [2, 3] [4, 5]" in out
    assert "sp groups: [0, 2, 4] [1, 3, 5]" in out
    assert "sp_tp groups: [0, 2, 4, 1, 3, 5]" in out  # Shift paper §3.3.1


def test_plan_prints_a_node_layout(capsys):
    main(["plan", "--layout", "tp2,single,sp2"])
    out = capsys.readouterr().out
    assert "layout tp2,single@2,sp2@3-4: 3 group(s) over 5 ranks" in out
    assert "group 2: plan sp2@3-4" in out and "sp groups: [3, 4]" in out


def test_layout_and_parallel_sizes_exclude_each_other():
    from parashift.config import EngineConfig
    with pytest.raises(ValueError, match="either layout or the parallel sizes"):
        EngineConfig(layout="tp2,single", tensor_parallel_size=2)


def test_plan_takes_vllm_flag_names_and_the_world_from_the_degrees(capsys):
    main(["plan", "-tp", "2", "--data-parallel-size", "2"])
    out = capsys.readouterr().out
    assert "plan dp2xtp2: dp=2 pp=1 sp=1 tp=2 (4 ranks)" in out
    assert "rank 3: dp=1 pp=0 sp=0 tp=1" in out


def test_plan_without_degrees_or_layout_names_what_to_give(capsys):
    with pytest.raises(SystemExit):
        main(["plan"])
    assert "give the degrees (e.g. -tp 2), --world, or --layout" in capsys.readouterr().err


def test_plan_rejects_degrees_that_do_not_fill_the_world(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--world", "6", "--sp", "4"])
    assert "does not divide world 6" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "plan", "serve", "bench"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: parashift" in capsys.readouterr().out


@pytest.mark.parametrize("flags, expected", [([], None), (["--cuda-graphs"], True),
                                             (["--no-cuda-graphs"], False),
                                             (["--enforce-eager"], False)])
def test_cuda_graph_flags(flags, expected):
    """Graphs default to 'where possible' (None); vLLM's --enforce-eager turns them off."""
    import argparse

    from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(flags)).cuda_graphs is expected


def without(monkeypatch, module: str, *importers: str) -> None:
    """Makes `import module` fail as on a machine without it (as `pip install parashift`
    leaves fastapi out); `importers` are dropped from the cache so they import it again."""
    monkeypatch.setitem(sys.modules, module, None)
    for name in importers:
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.parametrize("argv", [["serve"], ["serve", "--model", "m", "--port", "1"],
                                  ["serve", "--help"]])
def test_serve_without_its_extra_names_the_extra(monkeypatch, capsys, argv):
    """Issue 18: `parashift serve --model ...` said "unrecognized arguments: --model"."""
    without(monkeypatch, "fastapi", "parashift.entrypoints.openai.cli_args",
            "parashift.entrypoints.openai.auth")
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == ("parashift serve needs the serve extra, which is not "
                                    "installed (fastapi is missing): pip install "
                                    "'parashift[serve]'")


def test_bench_without_its_extras_names_them(monkeypatch):
    without(monkeypatch, "httpx", "parashift.bench.cli", "parashift.bench.serve",
            "parashift.bench.client", "parashift.bench.runner", "parashift.bench.server_metrics")
    with pytest.raises(SystemExit, match=r"needs the serve and bench extras.*httpx.*"
                                         r"pip install 'parashift\[serve,bench\]'$"):
        main(["bench", "serve", "--workload", "interactive"])


def test_version_is_the_installed_one_or_pyproject(monkeypatch):
    import tomllib
    from importlib import metadata

    import parashift
    assert parashift.__version__ == metadata.version("parashift")

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", not_installed)
    with open(pathlib.Path(parashift.__file__).parent.parent / "pyproject.toml", "rb") as f:
        assert parashift.version.read_version() == tomllib.load(f)["project"]["version"]


def test_worker_heartbeat_timeout_flag_and_its_range():
    import argparse

    from parashift.config import EngineConfig
    from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(["--worker-heartbeat-timeout-s", "3"]))
    assert config.worker_heartbeat_timeout_s == 3.0
    for bad in (0.5, float("nan")):
        with pytest.raises(ValueError, match="worker_heartbeat_timeout_s must be >= 1"):
            EngineConfig(worker_heartbeat_timeout_s=bad)
    with pytest.raises(ValueError, match="worker_timeout_s must be > 0"):
        EngineConfig(worker_timeout_s=0)
    config = engine_config_from_args(parser.parse_args(["--worker-step-timeout-s", "30"]))
    assert config.worker_step_timeout_s == 30.0 and EngineConfig().worker_step_timeout_s == 60
    with pytest.raises(ValueError, match="worker_step_timeout_s must be > 0"):
        EngineConfig(worker_step_timeout_s=0)


def test_merge_weights_flag_and_its_values():
    import argparse

    from parashift.config import EngineConfig
    from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args([])).merge_weights == "reorder"
    config = engine_config_from_args(parser.parse_args(["--merge-weights", "materialize"]))
    assert config.merge_weights == "materialize"
    with pytest.raises(ValueError, match="merge_weights must be reorder, view or materialize"):
        EngineConfig(merge_weights="slice")  # Shift's name for view is not a merge mode


@pytest.mark.parametrize("flags, expected", [([], "tp"), (["--moe-parallel", "ep"], "ep"),
                                             (["--enable-expert-parallel"], "ep")])
def test_moe_parallel_flags(flags, expected):
    """Experts TP-sharded by default; vLLM's --enable-expert-parallel is --moe-parallel ep."""
    import argparse

    from parashift.config import EngineConfig
    from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(flags)).moe_parallel == expected
    with pytest.raises(ValueError, match="moe_parallel must be tp or ep, got 'dp'"):
        EngineConfig(moe_parallel="dp")


@pytest.mark.parametrize("flags, expected", [([], (None, "auto")),
                                             (["--quantization", "fp8", "--kv-cache-dtype", "fp8"],
                                              ("fp8", "fp8"))])
def test_quantization_flags(flags, expected):
    import argparse

    from parashift.entrypoints.engine_args import add_engine_args, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(flags))
    assert (config.quantization, config.kv_cache_dtype) == expected
    with pytest.raises(ValueError, match="quantization 'gptq' is not supported"):
        engine_config_from_args(parser.parse_args(["--quantization", "gptq"]))
