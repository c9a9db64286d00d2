"""`parashift profile` on the CPU: small sizes, a whole compute profile that loads back, and
the committed link profiles left as they are (one device)."""
from parashift.cli import main
from parashift.cost.profile import ComputeProfile, load


def test_profile_measures_the_cpu_and_writes_a_loadable_profile(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    main(["profile", "--output", str(out), "--device", "cpu", "--quick"])
    printed = capsys.readouterr().out
    profile = load(out)
    assert isinstance(profile, ComputeProfile) and profile.device == "cpu"
    assert profile.source.startswith("measured by `parashift profile` at commit")
    assert profile.hbm_bytes_per_s > 0 and profile.matmul_flops > 0
    assert 0 < profile.gemm.bw_eff <= 1 and profile.gemm.launch_s >= 0
    # the few-row GEMMs timed are kept by shape: the step model reads those shapes off them
    assert [r for r, _ in profile.gemm_timings(256, 256)] == [1, 4]
    assert 0 < profile.decode_attention.bw_eff <= 1 and 0 < profile.elementwise.bw_eff <= 1
    # host work from the engine's own decode steps, per step and per sequence
    assert [b for b, _ in profile.notes["host"]["points"]] == [1, 8]
    assert profile.host_step_s >= 0 and profile.host_seq_s >= 0
    assert "link profile is left as committed" in printed
