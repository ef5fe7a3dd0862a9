#!/usr/bin/env python3
"""Regenerate the "Performance" section of README.md from speed_check's JSON results.

    python benchmarks/readme_performance.py benchmarks/results/cpu-full_0.3b.json \
        [benchmarks/results/cpu-quick.json ...] [--readme README.md]

The section sits between the markers <!-- performance:begin --> and <!-- performance:end -->
(added at the end of the README when absent). Ratios come first, then the times they come from;
every number is one that speed_check measured, beside the original in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"


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


def section_for(report: dict, path: str, across: str | None = None) -> list[str]:
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
    # The widest vector ISA in the title too: the same model's runs on an AVX512-BF16 machine and
    # on an AVX2-only one stand side by side, and their ratios differ.
    flags = set(meta.get("isa_flags") or [])
    # AMX-BF16 above all: there bfloat16 runs on tiles, 4-5x float32 (README "CPU dtypes").
    isa = ("AMX-BF16" if "amx_bf16" in flags else "AVX512-BF16" if meta["avx512_bf16"]
           else "AVX-512" if "avx512f" in flags else "AVX2 only" if "avx2" in flags else "")
    if isa and not meta["quick"]:
        # The vendor too: AMD's and Intel's AVX-512 cores differ (twice the float32 FMA rate on
        # the Intel Xeon; bfloat16 refused there, see README "CPU dtypes").
        cpu = str(meta.get("cpu", ""))
        vendor = "AMD" if "AMD" in cpu else "Intel" if "Intel" in cpu else ""
        title += f" ({vendor + ', ' if vendor else ''}{isa})"
    lines += [f"### {title}", "",
              f"{meta['date']}, {meta['cpu']} ({meta['cores']} cores"
              f"{', ' + isa if isa else ''}), device {meta['device']}, "
              f"torch {meta['torch']}; load x{p['load_repeats']}, first call, {p['warmup']} "
              f"warm-up, median of {p['rounds']} rounds x {p['calls']} calls, modes alternating; "
              f"[`{path}`]({path})."]
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
                     f"{e.get('checked_against', 'original')}.")
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

    all_cols = [cols[ref]] + ([cols["original"]] if ref != "original" and "original" in cols
                              else []) + modes
    lines += ["", "Time per call, ms (median):", "",
              "| image | " + " | ".join(c["title"] for c in all_cols) + " |",
              "|---|" + "---:|" * len(all_cols)]
    for r in report["results"]:
        by = r["columns"]
        cells = [f"{by[c['id']]['median_ms']:.0f}" if c["id"] in by else "n/a" for c in all_cols]
        lines.append(f"| {size(r)} | " + " | ".join(cells) + " |")
    reasons: dict[str, list[str]] = {}
    for c in report["columns"]:
        if c.get("reason"):
            reasons.setdefault(c["reason"], []).append(c["title"])
    for reason, titles in reasons.items():
        lines += ["", f"Not run: {', '.join(titles)} ({reason})."]
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--readme", type=Path, default=Path(__file__).resolve().parents[1] / "README.md")
    args = ap.parse_args(argv)
    root = args.readme.resolve().parent
    body = ["## Performance", "",
            "Measured with `benchmarks/speed_check` (see `benchmarks/README.md`): every mode runs in "
            "its own process beside the authors' pipeline, `original (Python)` (Sapiens v1: "
            "torch.jit.load, cv2 preprocessing, F.interpolate of the logits, argmax, as the "
            "Sapiens-Lite demo does it; Sapiens2: the authors' module structure in float32 with "
            "their demo's preprocessing), the `original` mode (v1's TorchScript graph through this "
            "library) and, where the run has them, the runtimes a CPU user would pick instead "
            "(ONNX Runtime and OpenVINO on the project's ONNX export, Hugging Face transformers "
            "for Sapiens2), in the same run on the same machine. The checkpoints are random-weight "
            "files with the exact structure of the released ones (`tools/make_fixtures.py`, "
            "`tools/sapiens2_fixtures.py`); speed does not depend on the weight values. "
            "Regenerate this section with `benchmarks/readme_performance.py`. A model's peers "
            "may be split over several runs that each fit in memory (ratios are taken within a "
            "run); "
            "`benchmarks/README.md` (\"Against the peers\") sets them side by side and shows "
            "where the time goes.", ""]
    reports = [json.loads(path.read_text()) for path in args.results]
    across = split_run_goals(reports)
    for i, (path, report) in enumerate(zip(args.results, reports)):
        rel = path.resolve().relative_to(root).as_posix()
        body += section_for(report, rel, across.get(i))
    text = "\n".join(body).rstrip() + "\n"
    readme = args.readme.read_text()
    block = f"{BEGIN}\n{text}{END}"
    if BEGIN in readme and END in readme:
        pre, rest = readme.split(BEGIN, 1)
        post = rest.split(END, 1)[1]
        readme = pre + block + post
    elif "\n## Layout" in readme:  # first time: before the layout section
        pre, post = readme.split("\n## Layout", 1)
        readme = pre.rstrip() + "\n\n" + block + "\n\n## Layout" + post
    else:
        readme = readme.rstrip() + "\n\n" + block + "\n"
    args.readme.write_text(readme)
    print(f"updated {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
