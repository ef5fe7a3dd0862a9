"""The README's performance section: goals of a model whose peers ran in separate runs.

At Sapiens2 1b the ONNX peers do not fit in 24 GiB beside the library together, so each runs in
a run of its own; a run holding only the slower peer must not read as a met float32 goal.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import readme_performance as rp  # noqa: E402


def report(peers: dict[str, tuple[str, str, float]], lib_f32: float, lib_bf16: float | None = None,
           *, date: str = "2026-12-03", model: str = "s2_full_1b.safetensors") -> dict:
    """A speed_check result at 1024x768 with the library's columns and the given peers
    (id -> (title, dtype, median ms))."""
    columns = [{"id": "portable float32", "title": "portable float32", "available": True,
                "dtype": "float32"}]
    times = {"portable float32": {"median_ms": lib_f32}}
    if lib_bf16 is not None:
        columns.append({"id": "portable bfloat16", "title": "portable bfloat16",
                        "available": True, "dtype": "bfloat16"})
        times["portable bfloat16"] = {"median_ms": lib_bf16}
    for pid, (title, dtype, ms) in peers.items():
        columns.append({"id": pid, "title": title, "available": True, "dtype": dtype})
        times[pid] = {"median_ms": ms}
    return {"meta": {"quick": False, "device": "cpu", "model_file": model,
                     "cpu": "Intel(R) Xeon(R) Processor", "isa_flags": ["avx512f", "amx_bf16"],
                     "date": date},
            "columns": columns,
            "results": [{"height": 1024, "width": 768, "batch": 1, "columns": times}]}


def test_the_float32_goal_is_taken_against_the_fastest_peer_of_any_run():
    runs = [report({"onnxruntime": ("ONNX Runtime", "float32", 43000.0)}, 34700.0),
            report({"openvino f32": ("OpenVINO f32", "float32", 33000.0)}, 35400.0, 9500.0),
            report({"openvino default": ("OpenVINO default", "bfloat16", 11000.0)}, 35000.0,
                   9600.0)]
    # Alone, the ONNX Runtime run would call the goal met.
    assert "(met)" in rp.peer_goals(runs[0])[0]
    lines = rp.split_run_goals(runs)
    assert list(lines) == [2]  # on the model's last run only
    assert "0.93x against OpenVINO f32, the lowest (missed)" in lines[2]
    assert "bfloat16 >= 1.1x OpenVINO's bfloat16: 1.15x (met)" in lines[2]
    # A peer in two runs counts at its better showing against the library.
    again = report({"openvino f32": ("OpenVINO f32", "float32", 34000.0)}, 34700.0)
    assert "0.93x against OpenVINO f32" in rp.split_run_goals(runs + [again])[3]


def test_runs_of_other_days_models_or_single_runs_get_no_line():
    # One run with a float32 and a bfloat16 peer: its own goal line says it all.
    one = report({"onnxruntime": ("ONNX Runtime", "float32", 43000.0),
                  "openvino default": ("OpenVINO default", "bfloat16", 11000.0)}, 34700.0, 9600.0)
    other_day = report({"openvino f32": ("OpenVINO f32", "float32", 33000.0)}, 35400.0,
                       date="2026-12-02")
    other_model = report({"openvino f32": ("OpenVINO f32", "float32", 33000.0)}, 35400.0,
                         model="s2_full_0.4b.safetensors")
    assert rp.split_run_goals([one]) == {}
    assert rp.split_run_goals([one, other_day, other_model]) == {}
