"""The performance pages (benchmarks/readme_performance.py): docs/performance.md, the README's
summary table, and the goals of a model whose peers ran in separate runs.

At Sapiens2 1b the ONNX peers do not fit in 24 GiB beside the library together, so each runs in
a run of its own; a run holding only the slower peer must not read as a met float32 goal.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from conftest import REPO
sys.path.insert(0, str(REPO / "benchmarks"))

import readme_performance as rp  # noqa: E402


def report(peers: dict[str, tuple[str, str, float]], lib_f32: float, lib_bf16: float | None = None,
           *, date: str = "2026-12-03", model: str = "s2_full_1b.safetensors") -> dict:
    """A speed_check result at 1024x768 with the library's columns and the given peers
    (id -> (title, dtype, median ms)). Each column's load takes 1 s and its first call its median
    plus 2 s, so a column's time to first labels is its median plus 3 s."""
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
    for t in times.values():
        t["first_ms"] = t["median_ms"] + 2000.0
        t["peak_rss"] = 1 << 30
    return {"meta": {"quick": False, "device": "cpu", "model_file": model, "model_bytes": 1 << 30,
                     "cpu": "Intel(R) Xeon(R) Processor", "isa_flags": ["avx512f", "amx_bf16"],
                     "date": date, "cores": 2, "torch": "2.15.0",
                     "protocol": {"load_repeats": 1, "warmup": 1, "rounds": 3, "calls": 1}},
            "columns": columns, "load_ms": {c: 1000.0 for c in times},
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


def test_the_summary_takes_each_peers_newest_run_and_the_fastest_peer():
    runs = [report({"openvino f32": ("OpenVINO f32", "float32", 33000.0),
                    "openvino default": ("OpenVINO default (bf16)", "bfloat16", 9000.0)},
                   35400.0, 10000.0, date="2026-12-02"),
            report({"onnxruntime": ("ONNX Runtime", "float32", 43000.0)}, 34700.0,
                   date="2026-12-02"),
            # The library since: OpenVINO f32's newer run counts, not its better older one.
            report({"openvino f32": ("OpenVINO f32", "float32", 38000.0)}, 34000.0,
                   date="2026-12-03")]
    rows = rp.summary_rows(runs)
    assert list(rows) == [("s2_full_1b.safetensors", "cpu")]
    ratio, title, mine, theirs = rows[("s2_full_1b.safetensors", "cpu")]["f32"]
    # OpenVINO f32 at 1.12x (its newest run) is faster than ONNX Runtime at 1.24x.
    assert title == "OpenVINO f32" and round(ratio, 2) == 1.12
    # First labels from the same run: load + first call, library then peer.
    assert (mine, theirs) == (37000.0, 41000.0)
    ratio, title, mine, theirs = rows[("s2_full_1b.safetensors", "cpu")]["bf16"]
    assert round(ratio, 2) == 0.90 and (mine, theirs) == (13000.0, 12000.0)
    # The quick run is no row; a model without bfloat16 figures has no bfloat16 cell.
    quick = report({"onnxruntime": ("ONNX Runtime", "float32", 900.0)}, 1000.0)
    quick["meta"]["quick"] = True
    assert "bf16" not in rp.summary_rows(runs[1:])[("s2_full_1b.safetensors", "cpu")]
    assert rp.summary_rows([quick]) == {}


def write_run(folder: Path, name: str, run: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(run))
    return folder / name


def test_a_new_machine_folder_is_rendered_without_code_changes(tmp_path, capsys):
    results = tmp_path / "benchmarks" / "results"
    new = results / "zen9-new"
    write_run(new, "cpu-peers-s2_full_1b-a.json",
              report({"openvino f32": ("OpenVINO f32", "float32", 33000.0)}, 30000.0))
    write_run(new, "cpu-attention.json", {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2,
                                           "cpu_flags": "avx2 fma avx512f avx512_bf16"})
    # A replaced run kept for the record: not rendered.
    write_run(new / "earlier", "cpu-peers-s2_full_1b-before-a.json",
              report({"openvino f32": ("OpenVINO f32", "float32", 99000.0)}, 30000.0))
    page, readme = tmp_path / "docs" / "performance.md", tmp_path / "README.md"
    page.parent.mkdir()
    page.write_text(f"# P\n\n{rp.BEGIN}\n{rp.END}\n\nkept\n")
    readme.write_text(f"# R\n{rp.SUMMARY_BEGIN}\nstale\n{rp.SUMMARY_END}\nkept\n")
    args = ["--results", str(results), "--page", str(page), "--readme", str(readme)]
    assert rp.main(args + ["--check"]) == 1  # both out of date
    assert rp.main(args) == 0
    assert rp.main(args + ["--check"]) == 0
    text, summary = page.read_text(), readme.read_text()
    assert "## zen9-new" in text and text.endswith("\nkept\n")
    # Facts from what the files recorded, links relative to each page.
    assert "Intel Xeon Processor, 2 cores, AMX-BF16" in text
    assert "(../benchmarks/results/zen9-new/cpu-peers-s2_full_1b-a.json)" in text
    assert "[`cpu-attention.json`](../benchmarks/results/zen9-new/cpu-attention.json)" in text
    assert "before-a" not in text and "stale" not in summary and summary.endswith("\nkept\n")
    row = [line for line in summary.splitlines() if "zen9-new" in line]
    assert len(row) == 1 and "(docs/performance.md#zen9-new)" in row[0]
    assert "| Sapiens2 1b | **1.10x** vs OpenVINO f32 | 33.0 s, 36.0 s | - | - |" in row[0]
    assert rp.main(["--print", str(new / "cpu-peers-s2_full_1b-a.json")]) == 0
    assert capsys.readouterr().out.startswith("### `s2_full_1b.safetensors`: 1024x768")


def test_the_committed_pages_are_what_the_results_render(tmp_path):
    # docs/performance.md and the README's table are generated: a result added, moved or
    # changed without rendering again (or a hand edit of a figure) fails here.
    assert rp.main(["--check"]) == 0, "run .venv/bin/python benchmarks/readme_performance.py"
    # The check itself can fail: one figure changed in a copy of the results.
    results = tmp_path / "results"
    shutil.copytree(REPO / "benchmarks" / "results", results)
    run = results / "amd-zen4" / "cpu-peers-full_0.3b-b.json"
    data = json.loads(run.read_text())
    data["results"][0]["columns"]["portable float32"]["median_ms"] *= 0.5
    run.write_text(json.dumps(data))
    page, readme = tmp_path / "performance.md", tmp_path / "README.md"
    shutil.copy(REPO / "docs" / "performance.md", page)
    shutil.copy(REPO / "README.md", readme)
    assert rp.main(["--results", str(results), "--page", str(page), "--readme", str(readme),
                    "--check"]) == 1


def test_machine_facts_name_the_microarchitecture_from_the_recorded_cpu_identity(tmp_path):
    # speed_check's record (cpu_id) and machine_facts.py's (cpu as a dict) both name it; a CPU of
    # one model name ("AMD EPYC") is told apart by family and model, never by the folder's name.
    (tmp_path / "a.json").write_text(json.dumps(
        {"meta": {"cpu": "AMD EPYC", "cores": 2, "isa_flags": ["avx2", "fma"],
                  "cpu_id": {"vendor": "AuthenticAMD", "family": 26, "model": 2, "stepping": 0}}}))
    assert rp.machine_facts(tmp_path).startswith("AMD EPYC (Zen 5), 2 cores")
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.json").write_text(json.dumps(
        {"machine": {"cpu": {"name": "AMD EPYC", "vendor": "AuthenticAMD", "family": 25,
                             "model": 1, "isa_flags": ["avx2"]}, "cores": 2}}))
    assert rp.machine_facts(other).startswith("AMD EPYC (Zen 3), 2 cores")
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "c.json").write_text(json.dumps(
        {"meta": {"cpu": "Some CPU", "cores": 4,
                  "cpu_id": {"vendor": "GenuineIntel", "family": 6, "model": 1}}}))
    assert rp.machine_facts(unknown).startswith("Some CPU, 4 cores")


def test_a_gpu_run_shows_autocast_ratios_memory_graphs_and_the_split():
    # What speed_check records only on CUDA (tools/gpu/gpu_check.sh renders speed.md from it with
    # --print): every figure below must reach the page, each from its own field.
    run = report({}, 40.0, model="full_0.3b_torchscript.pt2")
    run["meta"]["device"] = "cuda"
    run["columns"] = [
        {"id": "original", "title": "original", "available": True},
        {"id": "original autocast float16", "title": "original autocast fp16", "available": True},
        {"id": "kernels float16", "title": "kernels fp16", "available": True},
        {"id": "portable float16", "title": "portable fp16", "available": False,
         "reason": "cuDNN attention unsupported"}]
    run["results"][0]["columns"] = {
        "original": {"median_ms": 60.0, "median_net_ms": 48.0},
        "original autocast float16": {"median_ms": 30.0, "median_net_ms": 24.0, "first_ms": 900.0,
                                      "peak_rss": 3 << 30, "cuda_peak_allocated": 2 << 30,
                                      "cuda_peak_reserved": 5 << 29},
        "kernels float16": {"median_ms": 10.0, "median_net_ms": 6.0, "first_ms": 450.0,
                            "peak_rss": 2 << 30, "cuda_peak_allocated": 1 << 30,
                            "cuda_peak_reserved": 3 << 29}}
    run["load_ms"] = {"original autocast float16": 1500.0, "kernels float16": 700.0}
    run["cuda_graphs"] = {"kernels float16": {"captured": 1, "eager": 1, "replays": 15,
                                              "eager_calls": 2, "failures": ["batch 3: oom"]}}
    run["split"] = {"kernels float16": {"backbone_ms": 4.5, "head_ms": 1.5, "note": "eager"}}
    text = "\n".join(rp.section_for(run, "gpu.json"))
    assert "Speed-up against original autocast fp16, end to end" in text
    # The page's reference is the float32 original; the autocast tables come on top of it.
    assert "| 1024x768 | 0.50x | 3.00x |" in text  # autocast / original, autocast / kernels
    assert "| 1024x768 | 0.50x | 4.00x |" in text  # network only: 24 / 48, 24 / 6
    assert "| 1024x768 | kernels fp16 | 450 | 700 | 2.00 | 1.00 | 1.50 |" in text
    assert "| kernels fp16 | 1 | 1 | 15 | 2 | batch 3: oom |" in text
    assert "| kernels fp16 | 4.50 | 1.50 | 25 % | eager |" in text
    assert "Not run: portable fp16 (cuDNN attention unsupported)." in text
    # A CPU run has none of these tables.
    cpu = "\n".join(rp.section_for(report({}, 40.0), "cpu.json"))
    assert "CUDA graphs" not in cpu and "autocast" not in cpu and "Backbone and head" not in cpu


def test_a_run_where_columns_did_not_run_still_renders_and_says_why():
    # The GPU rehearsal's case (no CUDA device: every column unavailable), and a run where the
    # reference failed but the library ran: the page says why instead of failing to render.
    run = report({}, 40.0, model="tiny_b_torchscript.pt2")
    run["meta"]["device"] = "cuda"
    for c in run["columns"]:
        c.update(available=False, reason="no CUDA device")
    run["columns"].append({"id": "original", "title": "original", "available": False,
                           "reason": "no CUDA device"})
    run["results"][0]["columns"] = {}
    text = "\n".join(rp.section_for(run, "gpu.json"))
    assert "Not run: portable float32, original (no CUDA device)." in text
    assert "Speed-up" not in text
    run["columns"][0].update(available=True, reason="")
    run["results"][0]["columns"] = {"portable float32": {"median_ms": 40.0, "peak_rss": 1 << 30}}
    text = "\n".join(rp.section_for(run, "gpu.json"))
    assert "| 1024x768 | 40 |" in text and "Not run: original (no CUDA device)." in text
