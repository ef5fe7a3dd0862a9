"""``python -m sapiens_seg.ray``: the command that segments a folder, a list or object-store
URIs on a Ray cluster, with the CLI's inputs, names, licence gate, summary and exit statuses
(the library's own rules, through the binding)."""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import subprocess
import sys
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import ray
import ray.data

from .. import _core
from .._option_flags import add_option_flags
from ..segmentation import OPTION_SPECS
from ..errors import ErrorCode
from ._segmenter import segment_dataset
from ._storage import _absolute, _is_uri, _resolve, _write_file

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

# The CLI's default --ext list, images only (videos are for the CLI): the library's list.
_IMAGE_EXTS = tuple(_core.image_extensions())


def output_names(paths: Sequence[str], output_dir: str = ".") -> list[str]:
    """The CLI's output names for these inputs written into ``output_dir``, in this order: the
    library's own naming rule (``docs/cli-outputs.md``), so the two drivers name alike. A stem
    shared by several inputs is extended by their extensions, then by a hash of their paths.

    Example::

        output_names(["a/x.jpg", "b/x.png", "b/y.png"])   # ['x_jpg', 'x_png', 'y']
    """
    return _core.output_bases([os.fsencode(p) for p in paths], os.fsencode(output_dir))


def _exit_status(label: str) -> int:
    """The CLI's exit status for a failure spelled ``label``; internal_error's for an unknown
    one."""
    try:
        return ErrorCode.from_label(label).exit_status
    except ValueError:
        return ErrorCode.INTERNAL.exit_status


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sapiens_seg.ray",
        description="Segment images on a Ray cluster (Ray Data): label PNGs <name>_seg.png in "
                    "OUTPUT, as `sapiens-seg segment --save labels` writes them, plus "
                    "summary.json and summary.parquet (per-image size, pixels per class, "
                    "errors).")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="image files, folders, @list.txt (one path per line) or URIs "
                        "(s3://bucket/dir/, ...)")
    p.add_argument("-o", "--output", required=True, help="output folder or URI")
    p.add_argument("-m", "--model", default=_core.default_model(),
                   help="card id or checkpoint path (default: %(default)s)")
    # One flag per row of the library's option table (load, segment and run options).
    add_option_flags(p, meanings=_ACTOR_MEANING)
    p.add_argument("--concurrency", type=int, default=None,
                   help="actors (each holds a copy of the model; default: as many as fit)")
    p.add_argument("--gpus-per-actor", type=float, default=0.0,
                   help="GPUs reserved per actor (an actor with one runs on it)")
    p.add_argument("--cpus-per-actor", type=float, default=None,
                   help="CPUs reserved per actor (default: 1)")
    p.add_argument("-r", "--recursive", action="store_true", help="search folders recursively")
    p.add_argument("--ext", default=",".join(e[1:] for e in _IMAGE_EXTS),
                   help="file extensions taken from folders (default: %(default)s)")
    p.add_argument("--address", default=None,
                   help="an existing cluster (auto, HOST:PORT, ray://HOST:PORT); default: start "
                        "a local one for this run")
    p.add_argument("--num-cpus", type=int, default=None, help="local cluster: CPUs")
    p.add_argument("--num-gpus", type=int, default=None, help="local cluster: GPUs")
    p.add_argument("--max-task-retries", type=int, default=3,
                   help="retries of a batch whose actor crashed (default: %(default)s)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    return p


# In an actor, these options at their defaults mean the actor's own resources.
_ACTOR_MEANING = {"device": "the GPU Ray assigned to the actor, else the CPU",
                  "threads": "the CPUs Ray assigned to the actor"}


def _options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed load and segment options by name (run options are the driver's own)."""
    return {s["name"]: getattr(args, s["name"]) for s in OPTION_SPECS if s["group"] != "run"}


def _list_inputs(args: Iterable[str], recursive: bool, ext: str,
                 output: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """(found, failed as (input, error code, message)), in the CLI's order: arguments in order,
    folders sorted, lists as listed. Local files, folders, @lists and - follow the CLI's own rules
    (the library's, through the binding); URIs are listed here, through pyarrow."""
    x = _core.expand_inputs([os.fsencode(a) for a in args], ext, recursive,
                            b"" if _is_uri(output) else os.fsencode(output))
    for note in x["notes"]:
        print(f"sapiens-seg-ray: {note}", file=sys.stderr)
    if x["excluded"]:
        print(f"sapiens-seg-ray: {x['excluded']} files in the output folder {output} are outputs "
              "of sapiens-seg: not taken as inputs", file=sys.stderr)
    exts = {("." + e.strip().lstrip(".")).lower() for e in ext.split(",") if e.strip()}
    found: list[str] = []
    failed: list[tuple[str, str, str]] = list(x["problems"])
    for item, video in x["items"]:
        if video:  # the CLI segments videos frame by frame; this driver takes images only
            failed.append((item, ErrorCode.INVALID_INPUT.label,
                           f"{item} is a video: segment it with sapiens-seg segment"))
            continue
        if not _is_uri(item):
            found.append(item)
            continue
        try:
            fs, p, prefix = _resolve(item, None)
            info = fs.get_file_info(p)
        except (pa.ArrowException, OSError, ValueError) as e:
            failed.append((item, ErrorCode.IO.label, f"cannot open {item}: {e}"))
            continue
        if info.type == pafs.FileType.Directory:
            sel = pafs.FileSelector(p, recursive=recursive)
            files = sorted(i.path for i in fs.get_file_info(sel)
                           if i.type == pafs.FileType.File
                           and os.path.splitext(i.path)[1].lower() in exts)
            if isinstance(fs, pafs.LocalFileSystem):
                prefix = "file://"
            found += [prefix + f for f in files]
        elif info.type == pafs.FileType.File:
            found.append(item)
        else:
            failed.append((item, ErrorCode.NOT_FOUND.label, f"input not found: {item}"))
    return found, failed


def _precheck(model: str, accept_noncommercial: bool, local: bool) -> tuple[int, str] | None:
    """Fails fast in the driver, before any actor starts, on what would fail every actor. The
    card lookup (``id@revision`` included) and the licence gate are the library's own."""
    from .. import find_card
    from ..errors import LicenseNotAcceptedError, WeightsNotFoundError

    if os.path.exists(model):
        return None
    try:
        card = find_card(model)
    except WeightsNotFoundError as e:
        if not local:
            return None  # a path that only the cluster's nodes have, or their own cards
        if os.sep in model or model.endswith((".pt2", ".pt", ".safetensors")):
            return ErrorCode.NOT_FOUND.exit_status, f"model file not found: {model}"
        return ErrorCode.NOT_FOUND.exit_status, str(e)
    try:
        _core.check_license(card.id, accept_noncommercial)
    except LicenseNotAcceptedError as e:
        return ErrorCode.LICENSE_NOT_ACCEPTED.exit_status, str(e)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sapiens_seg.ray INPUT... -o OUT`` (``sapiens-seg-ray``): segments images on
    a Ray cluster; returns the exit status (0, or as the CLI: 2 usage, 10 + the first failed
    input's error code).

    Example::

        python -m sapiens_seg.ray photos/ -o labels/ --model model.pt2 --num-cpus 4
        python -m sapiens_seg.ray @frames.txt -o s3://bucket/labels/ --address auto \\
            --gpus-per-actor 1 --concurrency 8 --accept-noncommercial
    """
    args = _parser().parse_args(argv)
    for spec in OPTION_SPECS:
        value = getattr(args, spec["name"])
        if spec["type"] == "int" and not spec["min"] <= value <= spec["max"]:
            print(f"sapiens-seg-ray: --{spec['name'].replace('_', '-')} must be from "
                  f"{spec['min']} to {spec['max']}", file=sys.stderr)
            return 2
    found, failed = _list_inputs(args.inputs, args.recursive, args.ext, args.output)
    if not found and not failed:
        print("sapiens-seg-ray: error [invalid_input]: no inputs (folders are searched for "
              f"{args.ext}; use --recursive for sub-folders)", file=sys.stderr)
        return ErrorCode.INVALID_INPUT.exit_status
    model = os.path.abspath(args.model) if os.path.exists(args.model) else args.model
    refused = _precheck(model, args.accept_noncommercial, local=args.address is None)
    if refused is not None:
        print(f"sapiens-seg-ray: error: {refused[1]}", file=sys.stderr)
        return refused[0]
    out_fs, out_base, _ = _resolve(_absolute(args.output), None)
    try:
        if isinstance(out_fs, pafs.LocalFileSystem):
            os.makedirs(out_base, exist_ok=True)
        else:
            out_fs.create_dir(out_base, recursive=True)
    except OSError as e:
        print(f"sapiens-seg-ray: error [io_error]: cannot create output folder {args.output}: "
              f"{e}", file=sys.stderr)
        return ErrorCode.IO.exit_status

    if args.address is None and not os.path.exists(model):
        # A local cluster has one node, this one: fetch and verify the weights here first, with
        # the CLI's progress bar and messages, so the actors find them in the cache.
        status = _prefetch(model, args.allow_unverified)
        if status != 0:
            return status

    if not found:  # only inputs that failed before Ray: nothing for Ray to do
        status, n_ok, n_failed = _write_summaries(None, failed, out_fs, out_base, model)
        print(f"sapiens-seg-ray: {n_ok} segmented, {n_failed} failed", file=sys.stderr)
        return status

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.address is not None:
        ray.init(address=args.address, log_to_driver=not args.quiet)
    else:
        ray.init(num_cpus=args.num_cpus, num_gpus=args.num_gpus, include_dashboard=False,
                 log_to_driver=not args.quiet)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # summary in input order, whatever ran first
        if args.quiet:
            ctx.enable_progress_bars = False
        # The rows (input as given, absolute path or URI, output name) are made here and handed
        # to Ray as local blocks: a few blocks per actor, each a whole number of batches.
        rows = [{"input": p, "path": _absolute(p), "name": n}
                for p, n in zip(found, output_names(found, args.output))]
        n_blocks = min(len(rows), 4 * max(1, args.concurrency or 2))
        per_block = max(args.batch_size, -(-len(rows) // n_blocks))
        ds = segment_dataset(
            ray.data.from_items(rows, override_num_blocks=-(-len(rows) // per_block)),
            model, batch_size=args.batch_size, concurrency=args.concurrency,
            num_gpus=args.gpus_per_actor, num_cpus=args.cpus_per_actor,
            max_task_retries=args.max_task_retries, output=_absolute(args.output),
            return_labels=False, **_options_of(args))
        try:
            status, n_ok, n_failed = _write_summaries(ds, failed, out_fs, out_base, model)
        except Exception as e:  # noqa: BLE001 - the job as a whole failed (Ray says why)
            code, message = _job_error(e)
            print(f"sapiens-seg-ray: error [{code}]: the Ray job failed: {message}",
                  file=sys.stderr)
            return _exit_status(code)
    finally:
        ray.shutdown()
    print(f"sapiens-seg-ray: {n_ok} segmented, {n_failed} failed; label PNGs and summary in "
          f"{args.output}")
    return status


def _prefetch(model: str, allow_unverified: bool) -> int:
    """``sapiens-seg models download MODEL`` on this machine; returns its exit status (0 when
    the weights were already there and verified, or when the CLI is not found: the actors then
    fetch them through the same store)."""
    from ..__main__ import find_cli

    cli = find_cli()
    if cli is None:
        return 0
    env = dict(os.environ)
    if allow_unverified:
        env["SAPIENS_SEG_ALLOW_UNVERIFIED"] = "1"
    return subprocess.run([cli, "models", "download", model], stdout=subprocess.DEVNULL,
                          env=env, check=False).returncode


def _job_error(e: BaseException) -> tuple[str, str]:
    """(code, message) of a failed job. An actor whose constructor raised (weights missing, a
    bad checkpoint, ...) reaches the driver as Ray's ActorDiedError, which keeps the original
    only as text: the library's exception is found in that text."""
    from .. import errors

    text = str(e)
    m = re.search(r"sapiens_seg\.errors\.(\w+): (.*)", text, re.S)
    if m:
        cls = getattr(errors, m.group(1), None)
        if isinstance(cls, type) and issubclass(cls, errors.SapiensSegError):
            return cls.code.label, m.group(2).strip()
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return ErrorCode.INTERNAL.label, lines[-1] if lines else type(e).__name__


def _write_summaries(ds: ray.data.Dataset | None, failed: list[tuple[str, str, str]],
                     fs: pafs.FileSystem, base: str, model: str) -> tuple[int, int, int]:
    """Streams the results into summary.parquet and summary.json; returns (exit status, ok,
    failed)."""
    import pyarrow.parquet as pq
    from .. import __version__

    entries: list[dict[str, Any]] = []
    status = 0
    n_ok = n_failed = 0
    for path, code, message in failed:  # inputs that never reached Ray, first (as the CLI)
        entries.append({"input": path, "status": "error", "error": code, "message": message})
        status = status or _exit_status(code)
        n_failed += 1
    parquet_tmp = posixpath.join(base, f".summary.parquet.tmp-{uuid.uuid4().hex[:8]}")
    writer = None
    try:
        if ds is not None:
            for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
                batch = _string_columns(batch)
                if writer is None:
                    writer = pq.ParquetWriter(parquet_tmp, batch.schema, filesystem=fs)
                writer.write_table(batch)
                for row in batch.to_pylist():
                    if row["error"] is None:
                        n_ok += 1
                        entries.append({
                            "input": row["input"], "status": "ok", "height": row["height"],
                            "width": row["width"],
                            "classes": {k: v for k, v in row["class_pixels"].items() if v},
                            "outputs": {"labels_png": row["labels_png"]}})
                    else:
                        n_failed += 1
                        entries.append({"input": row["input"], "status": "error",
                                        "error": row["error_code"], "message": row["error"]})
                        status = status or _exit_status(row["error_code"])
        if writer is not None:
            writer.close()
            writer = None
            fs.move(parquet_tmp, posixpath.join(base, "summary.parquet"))
    finally:
        if writer is not None:
            writer.close()
            try:
                fs.delete_file(parquet_tmp)
            except OSError:
                pass
    summary = {"model": model, "version": __version__, "images": entries}
    _write_file(fs, posixpath.join(base, "summary.json"),
                (json.dumps(summary, indent=2) + "\n").encode())
    return status, n_ok, n_failed


def _string_columns(t: pa.Table) -> pa.Table:
    # A batch whose values are all null has null-typed columns: give every batch one schema.
    fields = [f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in t.schema]
    return t.cast(pa.schema(fields, metadata=t.schema.metadata))

