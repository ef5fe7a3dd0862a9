"""Which library runs the portable mode's float32 GEMMs (core/cpu/gemm), as `sapiens-seg info`
and `sapiens_seg.system_info()` report it, and the CPU's identity beside it.

Run through ctest (it sets SAPIENS_SEG_BUILD), or by hand:

    SAPIENS_SEG_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/python/test_cpu_gemm.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PKG_PARENT, CLI


def cpuinfo_first() -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def info(**env: str) -> subprocess.CompletedProcess:
    if not CLI.exists():
        pytest.skip(f"the CLI is not built in {CLI}")
    full = {k: v for k, v in os.environ.items() if not k.startswith("SAPIENS_SEG_CPU_")}
    full.update(env)
    return subprocess.run([str(CLI), "info"], capture_output=True, text=True, env=full,
                          timeout=120)


def test_info_names_the_cpu_by_vendor_family_model_and_stepping():
    fields = cpuinfo_first()
    if "cpu family" not in fields:
        pytest.skip("no x86 /proc/cpuinfo here")
    r = info()
    assert r.returncode == 0, r.stderr
    want = (f"({fields['vendor_id']} family {fields['cpu family']} model {fields['model']} "
            f"stepping {fields['stepping']})")
    assert want in r.stdout


@pytest.mark.parametrize("value,library", [("onednn", "oneDNN"), ("mkl", "MKL"),
                                           ("split", "MKL, oneDNN with fused GELU/residual")])
def test_info_says_which_library_runs_float32_gemms_and_why(value, library):
    r = info(SAPIENS_SEG_CPU_GEMM=value)
    assert r.returncode == 0, r.stderr
    assert (f"cpu gemm (portable):\n  float32 GEMMs: {library} (SAPIENS_SEG_CPU_GEMM={value})"
            in r.stdout)


def test_info_follows_the_cpu_table_by_default():
    r = info()
    assert r.returncode == 0, r.stderr
    line = r.stdout.split("cpu gemm (portable):\n  ", 1)[1].splitlines()[0]
    fields = cpuinfo_first()
    flags = set(fields.get("flags", "").split())
    zen5_or_later = (fields.get("vendor_id") == "AuthenticAMD"
                     and int(fields.get("cpu family", "0")) >= 0x1A
                     and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags)
    amd_avx2 = (fields.get("vendor_id") == "AuthenticAMD" and "avx512f" not in flags
                and {"avx2", "fma"} <= flags)
    want = ("float32 GEMMs: oneDNN (" if zen5_or_later else
            "float32 GEMMs: MKL (" if amd_avx2 else
            "float32 GEMMs: MKL, oneDNN with fused GELU/residual (")
    assert line.startswith(want), line


def test_a_malformed_override_is_refused_by_name():
    r = info(SAPIENS_SEG_CPU_GEMM="blas")
    assert r.returncode != 0
    assert "SAPIENS_SEG_CPU_GEMM" in r.stderr and "'blas'" in r.stderr


def test_python_system_info_carries_the_same_lines():
    if not any((PKG_PARENT / "sapiens_seg").glob("_core*")):
        pytest.skip(f"the Python extension is not built in {PKG_PARENT}")
    code = ("import sapiens_seg; i = sapiens_seg.system_info(); print(i.cpu_id); "
            "print(i.cpu_gemm)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPIENS_SEG_CPU_")}
    env["SAPIENS_SEG_CPU_GEMM"] = "onednn"
    env["PYTHONPATH"] = os.pathsep.join([str(PKG_PARENT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    cpu_id, gemm = r.stdout.splitlines()[:2]
    assert " family " in cpu_id and " model " in cpu_id and " stepping " in cpu_id
    assert gemm.startswith("float32 GEMMs: oneDNN (SAPIENS_SEG_CPU_GEMM=onednn); Sapiens2's "
                           "backbone keeps MKL")
