#!/usr/bin/env python3
"""Render the performance pages from speed_check's JSON results.

    python benchmarks/readme_performance.py            # rewrite docs/performance.md and README.md
    python benchmarks/readme_performance.py --check    # exit 1 when either is out of date
    python benchmarks/readme_performance.py --print benchmarks/results/amd-zen4/cpu-quick.json

`benchmarks/results/` holds one folder per machine; every speed_check result directly in a
machine folder is rendered (sub-folders such as `earlier/` are kept for the record, not rendered),
so a new machine's folder needs no change here. docs/performance.md gets every run's tables,
between the markers <!-- performance:begin --> and <!-- performance:end -->; README.md gets one
summary table, a row per machine and model, between <!-- performance-summary:begin --> and
<!-- performance-summary:end -->. Ratios come first, then the times they come from; every number
is one that speed_check measured, each ratio within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"
# Files a result names that have moved since it was recorded: the result keeps what it said then,
# the page names where the file is now.
MOVED = {"tools/sapiens2_reference.py": "tests/reference/sapiens2.py"}
SUMMARY_BEGIN = "<!-- performance-summary:begin -->"
SUMMARY_END = "<!-- performance-summary:end -->"
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_facts import microarchitecture  # noqa: E402


def moved(text: str) -> str:
    for old, new in MOVED.items():
        text = text.replace(old, new)
    return text


def ratio(num: float | None, den: float | None) -> str:
    if not num or not den:
        return "n/a"
    return f"{num / den:.2f}x"


def size(r: dict) -> str:
    return f"{r['height']}x{r['width']}" + (f", batch {r['batch']}" if r["batch"] != 1 else "")


def available(report: dict) -> list[dict]:
    return [c for c in report["columns"] if c["available"]]


# The CPU goals of the benchmark issue, for a full-size run on the CPU: (what, size, column,
# measure, bound, higher is better).
CPU_GOALS = [
    ("float32 speed at 1024x768", (1024, 768), "portable float32", "speed", 1.15, True),
    ("float32 end to end at 3000x4000", (3000, 4000), "portable float32", "speed", 1.5, True),
    ("float32 peak RSS at 3000x4000", (3000, 4000), "portable float32", "rss", 0.6, False),
    ("bfloat16 speed at 1024x768", (1024, 768), "portable bfloat16", "speed", 1.8, True),
]


PEERS = ("original-python", "onnxruntime", "openvino f32", "openvino default", "transformers")


def at_goal_size(res: dict) -> bool:
    """The result the peer goals are stated at: 1024x768, batch 1."""
    return (res["height"], res["width"], res["batch"]) == (1024, 768, 1)


def peer_ratios(report: dict) -> tuple[dict[str, float], float | None]:
    """At the goal size: each float32 peer's time over the library's float32 time, and OpenVINO's
    bfloat16 time over the library's bfloat16 time (None where the run has not both). The float32
    goal is against float32 peers: OpenVINO's default precision is bf16 or f16 on CPUs that have
    them, which is the bfloat16 goal's peer."""
    cols = {c["id"]: c for c in available(report)}
    f32: dict[str, float] = {}
    bf16 = None
    for res in filter(at_goal_size, report["results"]):
        by = res["columns"]
        lib = by.get("portable float32", {}).get("median_ms")
        for p in PEERS:
            if lib and p in cols and p in by and cols[p].get("dtype", "float32") == "float32":
                f32[p] = by[p]["median_ms"] / lib
        ov = cols.get("openvino default")
        if (ov and ov.get("dtype") == "bfloat16" and "openvino default" in by
                and "portable bfloat16" in by):
            bf16 = by["openvino default"]["median_ms"] / by["portable bfloat16"]["median_ms"]
    return f32, bf16


def met(r: float) -> str:
    return "met" if r >= 1.1 else "missed"


def peer_goals(report: dict) -> list[str]:
    """The goals against the runtimes a CPU user would pick instead (issue 18): portable float32
    >= 1.1x the fastest peer at 1024x768, bfloat16 >= 1.1x OpenVINO's bfloat16."""
    out = []
    titles = {c["id"]: c["title"] for c in available(report)}
    f32, bf16 = peer_ratios(report)
    if f32:
        fastest = min(f32, key=f32.get)  # one library time per run: the lowest ratio is the fastest
        out.append(f"float32 at 1024x768 >= 1.1x the fastest float32 peer of this run "
                   f"({titles[fastest]}): {f32[fastest]:.2f}x ({met(f32[fastest])})")
    if bf16 is not None:
        out.append(f"bfloat16 at 1024x768 >= 1.1x OpenVINO's bfloat16: {bf16:.2f}x ({met(bf16)})")
    return out


def split_run_goals(reports: list[dict]) -> dict[int, str]:
    """The peer goals of a model whose peers ran in several runs on one machine (one run per ONNX
    peer where they do not fit in memory together): each peer's ratio is taken within its own run,
    and the float32 goal is met only against every float32 peer, so a run holding only the slower
    peers cannot look like a met goal. Keyed by the index of the model's last report."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(reports):
        m = r["meta"]
        if m["quick"] or m["device"] != "cpu" or not any(map(at_goal_size, r["results"])):
            continue
        key = (m["model_file"], m.get("cpu"), tuple(m.get("isa_flags") or []), m["date"])
        groups.setdefault(key, []).append(i)
    out: dict[int, str] = {}
    for idx in groups.values():
        if len(idx) < 2:
            continue
        f32: dict[str, float] = {}
        names: dict[str, str] = {}
        bf16 = None
        for i in idx:
            ratios, run_bf16 = peer_ratios(reports[i])
            titles = {c["id"]: c["title"] for c in available(reports[i])}
            for p, r in ratios.items():
                f32[p] = min(f32.get(p, float("inf")), r)
                names[p] = titles[p]
            bf16 = run_bf16 if run_bf16 is not None else bf16
        parts = []
        if len(f32) > 1:
            worst = min(f32, key=f32.get)
            parts.append(f"float32 >= 1.1x every float32 peer: {f32[worst]:.2f}x against "
                         f"{names[worst]}, the lowest ({met(f32[worst])})")
        if bf16 is not None:
            parts.append(f"bfloat16 >= 1.1x OpenVINO's bfloat16: {bf16:.2f}x ({met(bf16)})")
        if parts:
            out[idx[-1]] = (f"Goals across this model's {len(idx)} runs on this machine (each "
                            "ratio within its own run): " + "; ".join(parts) + ".")
    return out


def goals(report: dict) -> list[str]:
    """One line per goal this run measures: the ratio against the original (Python), met or not."""
    meta = report["meta"]
    if meta["quick"] or meta["device"] != "cpu":
        return []
    lines = []
    pg = peer_goals(report)
    if pg:
        lines.append("Goals against the peers: " + "; ".join(pg) + ".")
    if meta["model_file"].endswith(".safetensors"):  # the goals below are Sapiens v1's
        return lines
    ids = {c["title"]: c["id"] for c in report["columns"]}
    out = []
    # A single load is not the warm-cache median the protocol asks for (3 loads).
    load = report.get("load_ms", {}) if meta["protocol"]["load_repeats"] >= 3 else {}
    fid = ids.get("portable float32")
    if fid in load and "original-python" in load:
        r = load["original-python"] / load[fid]
        out.append(f"load >= 3x torch.jit.load: {r:.2f}x ({'met' if r >= 3 else 'missed'})")
    for what, (h, w), title, kind, bound, higher in CPU_GOALS:
        for res in report["results"]:
            if (res["height"], res["width"], res["batch"]) != (h, w, 1):
                continue
            by = res["columns"]
            ref, got = by.get("original-python"), by.get(ids.get(title, ""))
            if not ref or not got:
                continue
            r = (ref["median_ms"] / got["median_ms"] if kind == "speed"
                 else got["peak_rss"] / ref["peak_rss"])
            ok = r >= bound if higher else r <= bound
            out.append(f"{what} {'>=' if higher else '<='} {bound}x: {r:.2f}x "
                       f"({'met' if ok else 'missed'})")
    if not out:
        return lines
    why = (" Why a missed goal cannot be met on this machine: `benchmarks/README.md`."
           if any("missed" in o for o in out) else "")
    return ["Goals against the original (Python): " + "; ".join(out) + "." + why] + lines


def isa_of(meta: dict) -> str:
    """The widest vector ISA a run recorded: the same model's runs on an AVX512-BF16 machine and
    on an AVX2-only one stand side by side, and their ratios differ. AMX-BF16 above all: there
    bfloat16 runs on tiles, 4-5x float32 (docs/cpu.md)."""
    flags = set(meta.get("isa_flags") or [])
    return ("AMX-BF16" if "amx_bf16" in flags else "AVX512-BF16" if meta.get("avx512_bf16")
            else "AVX-512" if "avx512f" in flags else "AVX2 only" if "avx2" in flags else "")


def vendor_of(meta: dict) -> str:
    # AMD's and Intel's AVX-512 cores differ (twice the float32 FMA rate on the Intel Xeon;
    # bfloat16 refused there, see docs/cpu.md).
    cpu = str(meta.get("cpu", ""))
    return "AMD" if "AMD" in cpu else "Intel" if "Intel" in cpu else ""


def section_for(report: dict, path: str, across: str | None = None,
                href: str | None = None) -> list[str]:
    """One run's section: `path` is the result's name as shown (repository-relative), `href` the
    link to it from the page the section goes into (default: `path`)."""
    meta = report["meta"]
    cols = {c["id"]: c for c in available(report)}
    # The reference of the ratio tables: the authors' pipeline, else the original mode, else (a
    # run of the library beside the ONNX peers only) the library's first column.
    ref = next((i for i in ("original-python", "original") if i in cols),
               next(iter(cols), "original"))
    modes = [c for c in available(report)
             if c["id"] not in ("original-python", "original") and c["id"] != ref]
    lines: list[str] = []
    sizes = ", ".join(dict.fromkeys(size(r) for r in report["results"]))
    against = ", ".join(cols[i]["title"] for i in PEERS if i in cols and i != "original-python")
    title = ("Quick run (tiny_b fixture: checks the pipeline, not representative of full-size "
             "speed)" if meta["quick"] else f"`{meta['model_file']}`: {sizes}"
             + (f"; against {against}" if against else ""))
    p = meta["protocol"]
    isa = isa_of(meta)
    if isa and not meta["quick"]:
        vendor = vendor_of(meta)
        title += f" ({vendor + ', ' if vendor else ''}{isa})"
    uarch = uarch_of(meta)
    lines += [f"### {title}", "",
              f"{meta['date']}, {meta['cpu']}{' (' + uarch + ')' if uarch else ''} "
              f"({meta['cores']} cores"
              f"{', ' + isa if isa else ''}), device {meta['device']}, "
              f"torch {meta['torch']}; load x{p['load_repeats']}, first call, {p['warmup']} "
              f"warm-up, median of {p['rounds']} rounds x {p['calls']} calls, modes alternating; "
              f"[`{path}`]({href or path})."]
    if meta.get("isa_flags"):
        lines.append("ISA flags: " + " ".join(meta["isa_flags"])
                     + (f" (oneDNN capped: {meta['onednn_cap']})" if meta.get("onednn_cap")
                        else "") + "; versions: "
                     + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()) + ".")
    ov = [c for c in available(report) if c["id"] == "openvino default"]
    if ov:
        lines.append(f"OpenVINO's default CPU precision here: {ov[0]['dtype']}.")
    if meta.get("onnx_export"):
        e = meta["onnx_export"]
        lines.append(f"The ONNX peers run the project's export (`tools/export_onnx.py`, opset "
                     f"{e.get('opset')}), checked before timing: max |logit diff| "
                     f"{e.get('max_abs_logit_diff', 0):.2g} against the "
                     f"{moved(e.get('checked_against', 'original'))}.")
    if not meta["quick"] and (p["warmup"], p["rounds"], p["calls"]) != (3, 3, 5):
        lines.append("A reduced protocol (the design's is 3 warm-ups and 3 rounds x 5 calls): one "
                     "full-size call takes tens of seconds on this machine.")
    background, used = [], []
    for r in report["results"]:
        for c in r["columns"].values():
            background += c.get("background_cpus", [])
            for ms, cpu in zip(c.get("rounds_ms", []), c.get("rounds_cpu_ms", [])):
                used += [b / a for a, b in zip(ms, cpu)]
    if background:
        quiet = statistics.median(background) < 0.1 and max(background) < 0.2
        lines.append(f"Other jobs used {statistics.median(background):.2f} CPUs (median, max "
                     f"{max(background):.2f}) just before the timed calls, which kept "
                     f"{statistics.median(used):.2f} CPUs busy themselves"
                     + (" (a quiet machine)." if quiet else
                        "; ratios compare rounds taken side by side, absolute times are not "
                        "those of an idle machine."))
    lines += goals(report)
    if across:
        lines.append(across)
    if not cols:  # nothing ran (no device, every column failed): say why, no tables
        return lines + not_run(report)
    lines.append("")

    # Ratios first: speed, then peak memory, against the original in Python.
    head = "| image | " + " | ".join(c["title"] for c in modes) + " |"
    rule = "|---|" + "---:|" * len(modes)
    lines += [f"Speed-up against the {cols[ref]['title']} (higher is better):", "", head, rule]
    for r in report["results"]:
        by = r["columns"]
        cells = [ratio(by.get(ref, {}).get("median_ms"), by.get(c["id"], {}).get("median_ms"))
                 for c in modes]
        lines.append(f"| {size(r)} | " + " | ".join(cells) + " |")
    lines += ["", f"Peak RSS against the {cols[ref]['title']} (lower is better):", "", head, rule]
    for r in report["results"]:
        by = r["columns"]
        cells = [ratio(by.get(c["id"], {}).get("peak_rss"), by.get(ref, {}).get("peak_rss"))
                 for c in modes]
        lines.append(f"| {size(r)} | " + " | ".join(cells) + " |")

    if any("median_net_ms" in c for r in report["results"] for c in r["columns"].values()):
        lines += ["", f"Network only (no pre- or post-processing), speed-up against the "
                      f"{cols[ref]['title']} (higher is better):", "", head, rule]
        for r in report["results"]:
            by = r["columns"]
            cells = [ratio(by.get(ref, {}).get("median_net_ms"),
                           by.get(c["id"], {}).get("median_net_ms")) for c in modes]
            lines.append(f"| {size(r)} | " + " | ".join(cells) + " |")
    lib = [c for c in available(report) if c["id"].startswith(("portable", "kernels"))]
    peers = [cols[i] for i in PEERS if i in cols]
    if lib and len(peers) > 1:
        def peer_table(caption: str, key: str, peer_over_lib: bool) -> list[str]:
            """One row per library column and size that has `key`: peer / library, or the
            inverse (memory: library / peer)."""
            rows = []
            for r in report["results"]:
                by = r["columns"]
                for c in lib:
                    if key not in by.get(c["id"], {}):
                        continue
                    mine = by[c["id"]][key]
                    cells = [ratio(by.get(q["id"], {}).get(key), mine) if peer_over_lib
                             else ratio(mine, by.get(q["id"], {}).get(key)) for q in peers]
                    rows.append(f"| {size(r)} | {c['title']} | " + " | ".join(cells) + " |")
            if not rows:
                return []
            return ["", caption, "",
                    "| image | library | " + " | ".join(f"vs {c['title']}" for c in peers) + " |",
                    "|---|---|" + "---:|" * len(peers)] + rows

        lines += peer_table("The library against each peer, end to end (peer time / library "
                            "time; higher: the library is faster):", "median_ms", True)
        lines += peer_table("The same, network only (no pre- or post-processing):",
                            "median_net_ms", True)
        lines += peer_table("Peak RSS of the library against each peer (library / peer; lower: "
                            "the library needs less):", "peak_rss", False)

    load = report.get("load_ms", {}) if p["load_repeats"] >= 3 else {}
    if "original" in load:
        lines += ["", "Load time against `torch::jit::load` of the same file (the original mode), "
                      "warm page cache: " + ", ".join(
                          f"{c['title']} {ratio(load['original'], load.get(c['id']))} "
                          f"({load.get(c['id'], 0):.0f} ms vs {load['original']:.0f} ms)"
                          for c in modes if c["id"] in load) + "."]

    acc = report.get("accuracy", {}).get("columns", {})
    if acc:
        parts = []
        for c in modes:
            a = acc.get(c["id"])
            if a and "max_abs_logit_diff" in a:
                parts.append(f"{c['title']} max |logit diff| {a['max_abs_logit_diff']:.2g}, "
                             f"labels {100 * a['label_agreement']:.2f} % equal")
        if parts:
            lines += ["", f"Outputs against the {cols[ref]['title']} on one synthetic image "
                          "(random weights make label agreement pessimistic): "
                      + "; ".join(parts) + "."]

    lines += device_tables(report, ref)

    all_cols = [cols[ref]] + ([cols["original"]] if ref != "original" and "original" in cols
                              else []) + modes
    lines += ["", "Time per call, ms (median):", "",
              "| image | " + " | ".join(c["title"] for c in all_cols) + " |",
              "|---|" + "---:|" * len(all_cols)]
    for r in report["results"]:
        by = r["columns"]
        cells = [f"{by[c['id']]['median_ms']:.0f}" if c["id"] in by else "n/a" for c in all_cols]
        lines.append(f"| {size(r)} | " + " | ".join(cells) + " |")
    return lines + not_run(report)


def not_run(report: dict) -> list[str]:
    """A line per reason that columns did not run or failed, naming them."""
    lines: list[str] = []
    reasons: dict[str, list[str]] = {}
    for c in report["columns"]:
        if c.get("reason"):
            reasons.setdefault(c["reason"], []).append(c["title"])
    for reason, titles in reasons.items():
        lines += ["", f"Not run: {', '.join(titles)} ({reason})."]
    lines.append("")
    return lines


def device_tables(report: dict, ref: str) -> list[str]:
    """What only GPU runs record: ratios against the authors' autocast fp16 (the product's GPU
    goal is stated against it), first calls, CUDA memory peaks, CUDA-graph capture counts and
    the backbone/head split. Nothing for a CPU run."""
    lines: list[str] = []
    cols = available(report)
    title = {c["id"]: c["title"] for c in cols}
    # Against the autocast column, unless it is already the page's reference (`ref`).
    autocast = [c["id"] for c in cols if c["id"].startswith("original autocast") and c["id"] != ref]
    for auto in autocast:
        others = [c for c in cols if c["id"] != auto]
        for key, what in (("median_ms", "end to end"), ("median_net_ms", "network only")):
            lines += ["", f"Speed-up against {title[auto]}, {what} (higher is better):", "",
                      "| image | " + " | ".join(c["title"] for c in others) + " |",
                      "|---|" + "---:|" * len(others)]
            for r in report["results"]:
                by = r["columns"]
                lines.append(f"| {size(r)} | " + " | ".join(
                    ratio(by.get(auto, {}).get(key), by.get(c["id"], {}).get(key))
                    for c in others) + " |")
    cuda = [c for c in cols if any("cuda_peak_allocated" in r["columns"].get(c["id"], {})
                                   for r in report["results"])]
    if cuda:
        lines += ["", "First call and memory (ms; GiB):", "",
                  "| image | mode | first call | load | peak RSS | CUDA allocated | "
                  "CUDA reserved |", "|---|---|---:|---:|---:|---:|---:|"]
        load = report.get("load_ms", {})
        for r in report["results"]:
            for c in cuda:
                m = r["columns"].get(c["id"])
                if not m:
                    continue
                cells = [fmt_ms(m.get("first_ms")), fmt_ms(load.get(c["id"])),
                         gib(m.get("peak_rss")), gib(m.get("cuda_peak_allocated")),
                         gib(m.get("cuda_peak_reserved"))]
                lines.append(f"| {size(r)} | {c['title']} | " + " | ".join(cells) + " |")
    graphs = report.get("cuda_graphs") or {}
    if graphs:
        lines += ["", "CUDA graphs (input shapes captured or run eagerly, and why):", "",
                  "| mode | captured | eager | replays | eager calls | why eager |",
                  "|---|---:|---:|---:|---:|---|"]
        for c in cols:
            g = graphs.get(c["id"])
            if g is None:
                continue
            why = "; ".join(g.get("failures", [])).replace("|", "/")
            lines.append(f"| {c['title']} | {g.get('captured', 0)} | {g.get('eager', 0)} | "
                         f"{g.get('replays', 0)} | {g.get('eager_calls', 0)} | {why} |")
    split = report.get("split") or {}
    if split:
        lines += ["", "Backbone and head, batch 1, eager (no CUDA graph), ms:", "",
                  "| mode | backbone | head | head share | note |", "|---|---:|---:|---:|---|"]
        for c in cols:
            sp = split.get(c["id"])
            if sp is None:
                continue
            b, h = sp.get("backbone_ms"), sp.get("head_ms")
            share = f"{100 * h / (b + h):.0f} %" if b and h else "n/a"
            note = str(sp.get("note", sp.get("error", ""))).replace("|", "/")
            lines.append(f"| {c['title']} | {fmt_ms(b, 2)} | {fmt_ms(h, 2)} | {share} | {note} |")
    return lines


def fmt_ms(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def gib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 2**30:.2f}"


def is_speed_check(data: object) -> bool:
    """speed_check's result files, among the other tools' JSON in a machine folder."""
    return (isinstance(data, dict) and isinstance(data.get("meta"), dict)
            and "protocol" in data["meta"] and "columns" in data and "results" in data)


def machine_folders(results: Path) -> list[Path]:
    return sorted(d for d in results.iterdir() if d.is_dir() and not d.name.startswith("."))


def load_runs(folder: Path) -> list[tuple[Path, dict]]:
    """The speed_check results directly in a machine folder, in reading order: the full-size runs
    before the quick one, smaller models first, runs at the goal size (1024x768) before runs at
    other sizes only, the newest first, then by name."""
    runs = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if is_speed_check(data):
            runs.append((path, data))
    size_of: dict[str, float] = {}
    for _, r in runs:
        m = r["meta"]
        size_of[m["model_file"]] = min(size_of.get(m["model_file"], float("inf")),
                                       m.get("model_bytes", 0))

    def key(item: tuple[Path, dict]):
        path, r = item
        m = r["meta"]
        return (m["quick"], size_of[m["model_file"]], m["model_file"],
                not any(map(at_goal_size, r["results"])),
                -int(m["date"].replace("-", "")), path.name)

    return sorted(runs, key=key)


def machine_facts(folder: Path) -> str:
    """What the machine is, from what its files recorded (never from the folder's name): CPU model,
    cores, widest ISA, and a GPU where a file names one."""
    cpu = cores = gpu = uarch = None
    flags: set[str] = set()
    bf16 = False

    def walk(o: object) -> None:
        nonlocal cpu, cores, gpu, bf16, uarch
        if isinstance(o, dict):
            uarch = uarch or uarch_of(o)
            for k, v in o.items():
                if k == "cpu" and isinstance(v, str):
                    cpu = cpu or v.replace("(R)", "").replace("(TM)", "")
                elif k == "cpu" and isinstance(v, dict):  # machine_facts.py's record
                    cpu = cpu or str(v.get("name", "")).replace("(R)", "").replace("(TM)", "")
                    walk(v)
                elif k == "cores" and isinstance(v, int):
                    cores = cores or v
                elif k in ("gpu", "gpu_name", "device_name") and isinstance(v, str):
                    gpu = gpu or v
                elif k == "avx512_bf16" and v is True:
                    bf16 = True
                elif k in ("isa_flags", "cpu_flags", "cpu_isa_flags"):
                    flags.update(v if isinstance(v, list) else str(v).split())
                else:
                    walk(v)
        elif isinstance(o, list):
            for x in o:
                walk(x)

    for path in sorted(folder.glob("*.json")):
        walk(json.loads(path.read_text()))
    isa = isa_of({"isa_flags": sorted(flags), "avx512_bf16": bf16 or "avx512_bf16" in flags})
    if cpu and uarch:
        cpu = f"{cpu} ({uarch})"
    parts = [p for p in (gpu, cpu, f"{cores} cores" if cores else None, isa) if p]
    return ", ".join(parts) if parts else "no machine facts recorded"


def uarch_of(record: dict) -> str | None:
    """The microarchitecture a record's CPU identity names (speed_check's `cpu_id`, or
    machine_facts.py's `cpu`), where the vendor/family/model triple is a known one."""
    ident = record.get("cpu_id") if isinstance(record.get("cpu_id"), dict) else \
        record.get("cpu") if isinstance(record.get("cpu"), dict) else None
    if not ident or "family" not in ident or "model" not in ident:
        return None
    return microarchitecture(str(ident.get("vendor", "")), int(ident["family"]),
                             int(ident["model"])) or None


def rel(target: Path, page: Path) -> str:
    return Path(os.path.relpath(target, page.parent)).as_posix()


def render_page(results: Path, page: Path) -> str:
    """The generated part of docs/performance.md: per machine folder, its runs' sections."""
    body = ["Generated by `benchmarks/readme_performance.py` from the JSON files in "
            "`benchmarks/results/`; edit those, not this part of the page.", ""]
    toc, sections = [], []
    for folder in machine_folders(results):
        runs = load_runs(folder)
        shown = folder.relative_to(REPO).as_posix() if folder.is_relative_to(REPO) else folder.name
        facts = machine_facts(folder)
        toc.append(f"- [{folder.name}](#{folder.name}): {facts}")
        sections += [f"## {folder.name}", "",
                     f"{facts}; files in [`{shown}/`]({rel(folder, page)}/).", ""]
        reports = [r for _, r in runs]
        across = split_run_goals(reports)
        for i, (path, report) in enumerate(runs):
            name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
            sections += section_for(report, name, across.get(i), rel(path, page))
        rendered = {p.name for p, _ in runs}
        others = [p for p in sorted(folder.glob("*.json")) if p.name not in rendered]
        if others:
            sections += ["Other measurements on this machine (what each is: "
                         "`benchmarks/README.md`): "
                         + ", ".join(f"[`{p.name}`]({rel(p, page)})" for p in others) + ".", ""]
    text = "\n".join(body + toc + [""] + sections).rstrip() + "\n"
    return text


def family(model_file: str) -> str:
    """A model's name for people: the family from the format, the size from the file name."""
    m = re.search(r"(\d+(?:\.\d+)?b)", model_file)
    fam = ("Sapiens v1" if model_file.endswith(".pt2") else "Sapiens2"
           if model_file.endswith(".safetensors") else model_file)
    return f"{fam} {m.group(1)}" if m and fam != model_file else model_file


def first_labels(report: dict, col: str) -> float | None:
    """Load plus the first call at the goal size, in ms: what a user waits for the first labels."""
    load = report.get("load_ms", {}).get(col)
    for res in filter(at_goal_size, report["results"]):
        first = res["columns"].get(col, {}).get("first_ms")
        if load is not None and first is not None:
            return load + first
    return None


def seconds(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms / 1000:.1f} s"


def summary_rows(runs: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (model, device): the library against its fastest float32 peer and against OpenVINO's
    bfloat16. Each ratio is taken within one run (peer_ratios); a peer's figure is that of its
    newest run (the library as it stands), the better showing where it ran twice that day; the
    fastest peer is the one with the lowest ratio."""
    latest: dict[tuple, dict[str, tuple]] = {}
    bf16: dict[tuple, tuple] = {}
    for r in runs:
        m = r["meta"]
        if m["quick"]:
            continue
        key = (m["model_file"], m["device"])
        f32, b = peer_ratios(r)
        titles = {c["id"]: c["title"] for c in available(r)}
        for p, ratio_ in f32.items():
            have = latest.setdefault(key, {}).get(p)
            cand = (m["date"], -ratio_, r, titles[p])
            if have is None or cand[:2] > have[:2]:
                latest[key][p] = cand
        if b is not None:
            have = bf16.get(key)
            cand = (m["date"], -b, r, titles["openvino default"])
            if have is None or cand[:2] > have[:2]:
                bf16[key] = cand
    out: dict[tuple[str, str], dict] = {}
    for key in sorted(set(latest) | set(bf16)):
        row: dict = {}
        if latest.get(key):
            p, (date, neg, r, title) = min(latest[key].items(), key=lambda kv: -kv[1][1])
            row["f32"] = (-neg, title, first_labels(r, "portable float32"), first_labels(r, p))
        if key in bf16:
            date, neg, r, title = bf16[key]
            row["bf16"] = (-neg, title, first_labels(r, "portable bfloat16"),
                           first_labels(r, "openvino default"))
        out[key] = row
    return out


def render_summary(results: Path, readme: Path, page: Path) -> str:
    """The README's one performance table."""
    lines = ["| machine | model | float32 | first labels, float32 | bfloat16 | first labels, "
             "bfloat16 |",
             "|---|---|---|---|---|---|"]
    link = rel(page, readme)
    for folder in machine_folders(results):
        facts = machine_facts(folder)
        rows = summary_rows([r for _, r in load_runs(folder)])
        for (model, device), row in rows.items():
            what = f"[{folder.name}]({link}#{folder.name}) ({facts})"
            dev = "" if device == "cpu" else f", {device}"
            cells = []
            for k in ("f32", "bf16"):
                if k in row:
                    r, title, mine, theirs = row[k]
                    cells += [f"**{r:.2f}x** vs {title}",
                              f"{seconds(mine)}, {seconds(theirs)}"]
                else:
                    cells += ["-", "-"]
            lines.append(f"| {what} | {family(model)}{dev} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def splice(text: str, begin: str, end: str, block: str, where: str) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"{where}: the markers {begin} ... {end} are missing")
    pre, rest = text.split(begin, 1)
    return pre + begin + "\n" + block + end + rest.split(end, 1)[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--page", type=Path, default=REPO / "docs" / "performance.md")
    ap.add_argument("--readme", type=Path, default=REPO / "README.md")
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 when a page differs from what the results give")
    ap.add_argument("--print", dest="show", type=Path, metavar="RESULT.json",
                    help="print one result's section, as the page shows it, and change nothing")
    args = ap.parse_args(argv)
    if args.show:
        report = json.loads(args.show.read_text())
        if not is_speed_check(report):
            raise SystemExit(f"{args.show}: not a speed_check result")
        print("\n".join(section_for(report, args.show.as_posix())).rstrip())
        return 0
    page_text = args.page.read_text()
    new_page = splice(page_text, BEGIN, END, render_page(args.results, args.page), str(args.page))
    readme_text = args.readme.read_text()
    new_readme = splice(readme_text, SUMMARY_BEGIN, SUMMARY_END,
                        render_summary(args.results, args.readme, args.page), str(args.readme))
    stale = [p for p, old, new in ((args.page, page_text, new_page),
                                   (args.readme, readme_text, new_readme)) if old != new]
    if args.check:
        for p in stale:
            print(f"{p} is out of date: run benchmarks/readme_performance.py", file=sys.stderr)
        return 1 if stale else 0
    args.page.write_text(new_page)
    args.readme.write_text(new_readme)
    for p in stale:
        print(f"updated {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
