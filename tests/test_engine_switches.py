"""Every 0/1 environment switch reads through `engine_switches.switch`: 1 on, 0 off, anything
else a ValueError naming the variable and the value."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parashift import engine_switches
from parashift.attention import cudnn_chunk, triton_backend, triton_decode_preload
from parashift.kernels import (argmax, dense_gemm, fp8_gemm, fp8_gemm_tma, fp8_gemv, moe_decode,
                               moe_prefill, pdl)

# (variable, its reader)
READERS = [
    (triton_backend.FUSED_REDUCE_ENV, triton_backend.fused_reduce_enabled),
    (triton_decode_preload.NEW_FIRST_ENV, triton_decode_preload.new_token_first),
    (cudnn_chunk.ENV, cudnn_chunk._switch),
    (fp8_gemm.FAST_ACCUM_ENV, fp8_gemm.fast_accum),
    (fp8_gemm_tma.ENV, fp8_gemm_tma.enabled),
    (fp8_gemv.EVICT_ENV, fp8_gemv.evict_first),
    (dense_gemm.ENV, dense_gemm.enabled),
    (pdl.EARLY_LOADS_ENV, pdl.early_loads),
    (argmax.ENV, argmax.enabled),
    (moe_prefill.ENV, moe_prefill.enabled),
    (moe_decode.ENV, moe_decode.enabled),
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name,read", READERS, ids=[name for name, _ in READERS])
def test_a_bad_value_is_an_error_naming_the_variable(monkeypatch, name, read):
    for bad in ("yes", "", "2"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=f"{name}='{bad}': expected 0 or 1"):
            read()
    monkeypatch.setenv(name, "0")
    assert read() is False


@pytest.mark.parametrize("name,read", READERS, ids=[name for name, _ in READERS])
def test_one_turns_it_on(monkeypatch, name, read):
    monkeypatch.setenv(name, "1")
    assert read() is True


def test_the_reader_takes_the_default_where_unset(monkeypatch):
    monkeypatch.delenv("PARASHIFT_TEST_SWITCH", raising=False)
    assert engine_switches.switch("PARASHIFT_TEST_SWITCH", "1") is True
    assert engine_switches.switch("PARASHIFT_TEST_SWITCH", "0") is False
    with pytest.raises(ValueError, match="PARASHIFT_TEST_SWITCH='on'"):
        engine_switches.switch("PARASHIFT_TEST_SWITCH", "on")


# switches read once, when their module is imported: a bad value fails the import
AT_IMPORT = [("PARASHIFT_FUSED_QK_NORM", "parashift.engine_switches"),
             ("PARASHIFT_FUSED_ROUTER", "parashift.engine_switches"),
             ("PARASHIFT_SKINNY_GEMM", "parashift.kernels.skinny_gemm"),
             ("PARASHIFT_SKINNY_GEMV", "parashift.kernels.skinny_gemm")]


@pytest.mark.parametrize("name,module", AT_IMPORT, ids=[name for name, _ in AT_IMPORT])
def test_a_bad_value_of_a_switch_read_at_import_fails_the_import(name, module):
    env = {**os.environ, name: "yes", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert f"{name}='yes': expected 0 or 1" in run.stderr
    env[name] = "0"
    assert subprocess.run([sys.executable, "-c", f"import {module}"], env=env, cwd=ROOT,
                          timeout=120).returncode == 0
