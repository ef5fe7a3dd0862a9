"""Batch segmentation on a Ray cluster with Ray Data: ``sapiens_seg.ray``.

For datasets that outgrow one machine. Ray Data schedules the work (actors, retries, back
pressure, progress); this module only supplies the per-actor model and the per-batch function::

    import ray
    from sapiens_seg.ray import segment_dataset

    ray.init()                                                   # or ray.init(address="auto")
    ds = ray.data.read_binary_files("s3://bucket/photos/", include_paths=True)
    out = segment_dataset(ds, "sapiens-seg-0.3b-goliath", accept_noncommercial=True,
                          output="s3://bucket/labels/", return_labels=False, batch_size=8,
                          concurrency=4, num_gpus=1)
    out.write_parquet("s3://bucket/stats/")                      # per-image stats and errors

or, with the class directly::

    ds.map_batches(SapiensSegmenter, fn_constructor_args=("sapiens-seg-0.3b-goliath",),
                   fn_constructor_kwargs={"accept_noncommercial": True}, batch_size=8,
                   batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=4), num_gpus=1)

``python -m sapiens_seg.ray INPUT... -o OUT`` (also installed as ``sapiens-seg-ray``) does the
whole job for a folder, a list file or object-store URIs; see :func:`main`.

Inputs (one row per image), in this order of preference:

* ``image``: an ``HxWx3`` uint8 RGB array, as ``ray.data.read_images(..., mode="RGB")`` makes
  (grey ``HxW`` and ``HxWx4`` arrays are accepted: grey replicated, alpha dropped). Note that
  Ray decodes these with PIL, which does not apply EXIF orientation: for labels identical to the
  ``sapiens-seg`` CLI use one of the next two.
* ``bytes``: encoded image bytes, as ``ray.data.read_binary_files(..., include_paths=True)``
  makes; decoded by the library exactly as the CLI decodes files.
* ``path``: a local path (readable on every node: a shared file system) or a URI that
  ``pyarrow.fs`` understands (``s3://``, ``gs://``, ``hdfs://``, ...); the actor reads it.

Outputs: the input's columns (less ``image`` and ``bytes``) plus

* ``labels``: uint8 ``[H, W]`` class indices (unless ``return_labels=False``);
* ``height``, ``width``;
* ``class_pixels``: a struct of pixel counts, one field per class name (``Background``, ...);
* ``class_fraction``: the same as fractions of the image's pixels;
* ``labels_png``: where the label PNG was written (with ``output=``), else null;
* ``error``, ``error_code``: null for a segmented image; for one that failed (corrupt, too
  small, unreadable) the message and the library's code (``invalid_input``, ``not_found``,
  ``io_error``, ...). A bad image fails its row, never the job.

Label PNGs are 8-bit grey, value = class index: the pixels of the CLI's ``--save labels``
files (the PNG encoding may differ byte for byte). They are named ``<name>_seg.png``, where
``name`` is the row's ``name`` column when there is one, else the input's file stem (with
``root=``: its path relative to ``root``, sub-folders kept); inputs whose stems collide need a
``name`` column (the command makes one with the CLI's rule, :func:`output_names`). Every
file is written to a temporary name and renamed (local folders) or uploaded whole (object
stores), so a batch that Ray retries after an actor crash rewrites the same files with the same
bytes, and no partial file is ever visible.

Weights: each actor loads the model once, in its constructor, through the library's weight store
(``SAPIENS_SEG_WEIGHTS_PATH``, the cache in ``SAPIENS_SEG_HOME``, the Hugging Face cache, else a
download; see the README). The store takes a lock file next to the download, so when several
actors on one node start together the first one downloads and verifies the file while the
others wait for it and then use the verified file: one download per node (per cache folder; a
cache on a shared file system makes it one per cluster). Nodes are not coordinated by this
module: to avoid any download at run time, place the file on every node, or in a shared
``SAPIENS_SEG_WEIGHTS_PATH``, beforehand (``sapiens-seg models download ID``).

Devices: an actor given GPUs by Ray (``num_gpus=``) runs on the first of them (Ray sets
``CUDA_VISIBLE_DEVICES``; :func:`ray.get_gpu_ids` says which), any other actor on the CPU with
as many LibTorch threads as Ray gave it CPUs. Pass ``device=`` to override.

Failures: a crashed actor (killed, out of memory, a lost node) is restarted by Ray and its
batches are retried (``max_restarts``, ``max_task_retries``); results do not depend on batch
size, actor count or retries, and equal the CLI's for the same model and options.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import posixpath
import re
import struct
import subprocess
import sys
import uuid
import warnings
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import ray
    import ray.data
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("sapiens_seg.ray needs Ray Data: pip install 'ray[data]'") from _e

import pyarrow as pa
import pyarrow.fs as pafs

from . import _core
from .errors import ErrorCode

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["SapiensSegmenter", "segment_dataset", "output_names", "main"]

LABELS_SUFFIX = "_seg.png"
"""What follows an image's name in its label PNG's name (as the CLI's ``--save labels``)."""

# The CLI's default --ext list, images only (videos are for the CLI).
_IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
_INPUT_COLUMNS = ("image", "bytes")  # dropped from the output (large)


# ---- the per-actor callable -------------------------------------------------------------------

class SapiensSegmenter:
    """A callable class for :meth:`ray.data.Dataset.map_batches` (``batch_format="numpy"``):
    loads the model once per actor, then segments each batch in one library call.

    Args:
        model: a card id (``"sapiens-seg-0.3b-goliath"``) or a checkpoint path readable on every
            node (absolute: actors do not share the driver's working folder).
        mode, dtype, normalization, accept_noncommercial, allow_unverified: as
            :func:`sapiens_seg.segmentation.load`.
        device: ``None``: the GPU Ray assigned to this actor, else the CPU. Or ``"cpu"``,
            ``"cuda"``, ``"cuda:N"``.
        threads: LibTorch CPU threads; ``None``: the number of CPUs Ray assigned to the actor.
        output: a folder or URI for label PNGs (``None``: none are written).
        filesystem: a ``pyarrow.fs.FileSystem`` for ``output`` and for ``path`` inputs (as Ray
            Data's readers and writers take; an fsspec one wrapped in
            ``pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))``). ``None``: from the URI.
        root: name outputs by the input's path relative to this folder (sub-folders kept)
            instead of by its stem alone.
        return_labels: include the ``labels`` column (large; the stats are always there).

    Example::

        seg = SapiensSegmenter("model.pt2", device="cpu")          # what each actor does
        out = seg({"path": np.array(["/data/a.jpg", "/data/b.png"], dtype=object)})
        out["class_pixels"][0]["Hair"], out["error"][1]
    """

    def __init__(self, model: str, *, mode: str = "auto", device: str | None = None,
                 dtype: str | None = None, normalization: str = "demo",
                 accept_noncommercial: bool = False, allow_unverified: bool = False,
                 threads: int | None = None, output: str | None = None,
                 filesystem: pafs.FileSystem | None = None, root: str | None = None,
                 return_labels: bool = True) -> None:
        from . import segmentation

        self.device = device if device is not None else _actor_device()
        self.threads = threads if threads is not None else _assigned_cpus()
        self.model = segmentation.load(model, mode=mode, device=self.device, dtype=dtype,
                                       normalization=normalization,
                                       accept_noncommercial=accept_noncommercial,
                                       allow_unverified=allow_unverified, threads=self.threads)
        self.classes: list[str] = list(self.model.info.classes)
        self._filesystem = filesystem
        self._fs_cache: dict[tuple[str, str], tuple[pafs.FileSystem, str]] = {}
        self._out: tuple[pafs.FileSystem, str, str] | None = None
        if output is not None:
            self._out = _resolve(output, filesystem)
        self._root = None if root is None else _resolve(root, filesystem)[1]
        self._return_labels = return_labels

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = _batch_len(batch)
        source = next((c for c in ("image", "bytes", "path") if c in batch), None)
        if source is None and n > 0:
            raise ValueError("sapiens_seg.ray: a batch needs an 'image', 'bytes' or 'path' column "
                             f"(got {sorted(batch)})")
        paths = batch.get("path")
        names = batch.get("name")

        # Decode one by one (a bad image fails its row), then segment what decoded in one call.
        pixels: list[np.ndarray | None] = [None] * n
        errors: list[tuple[str, str] | None] = [None] * n
        for i in range(n):
            try:
                pixels[i] = self._decode(source, batch[source][i])
            except Exception as e:  # noqa: BLE001 - recorded in the row
                errors[i] = _describe(e)
        results: list[Any] = [None] * n
        todo = [i for i in range(n) if pixels[i] is not None]
        try:
            # Ray's batch is the network batch (map_batches(batch_size=)).
            for i, r in zip(todo, self.model([pixels[i] for i in todo],
                                             batch_size=max(1, len(todo)))):
                results[i] = r
        except Exception:  # noqa: BLE001 - one image the network refuses (too small, ...)
            for i in todo:  # ... must not cost the others: again one at a time
                try:
                    results[i] = self.model(pixels[i])
                except Exception as e:  # noqa: BLE001
                    errors[i] = _describe(e)

        labels_col = _objects(n)
        height = np.zeros(n, np.int32)
        width = np.zeros(n, np.int32)
        counts = _objects(n)
        fractions = _objects(n)
        written = _objects(n)
        error = _objects(n)
        code = _objects(n)
        zero_counts = dict.fromkeys(self.classes, 0)
        zero_fractions = dict.fromkeys(self.classes, 0.0)
        for i in range(n):
            r = results[i]
            if r is not None:
                labels = r.labels
                height[i], width[i] = labels.shape
                c = np.bincount(labels.ravel(), minlength=len(self.classes))
                area = float(labels.size)
                counts[i] = {k: int(v) for k, v in zip(self.classes, c.tolist())}
                fractions[i] = {k: v / area for k, v in zip(self.classes, c.tolist())}
                if self._out is not None:
                    try:
                        written[i] = self._write(labels, None if paths is None else paths[i],
                                                 None if names is None else names[i])
                    except Exception as e:  # noqa: BLE001
                        errors[i] = _describe(e)
                if self._return_labels:
                    labels_col[i] = labels.copy()
            if errors[i] is not None or r is None:
                code[i], error[i] = errors[i]
                counts[i], fractions[i] = dict(zero_counts), dict(zero_fractions)
                height[i] = width[i] = 0
                written[i] = None
                if self._return_labels:
                    labels_col[i] = np.zeros((0, 0), np.uint8)

        out = {k: v for k, v in batch.items() if k not in _INPUT_COLUMNS}
        if self._return_labels:
            out["labels"] = labels_col
        out.update(height=height, width=width, class_pixels=counts, class_fraction=fractions,
                   labels_png=written, error=error, error_code=code)
        return out

    # -- helpers --

    def _decode(self, source: str, value: Any) -> np.ndarray:
        from . import segmentation
        from .errors import InvalidInputError

        if source == "image":
            a = np.asarray(value)
            if a.dtype != np.uint8:
                raise InvalidInputError(f"image: expected uint8 pixels, got {a.dtype}")
            if a.ndim == 2:
                a = np.repeat(a[:, :, None], 3, axis=2)
            elif a.ndim == 3 and a.shape[2] == 4:
                a = a[:, :, :3]
            elif a.ndim == 3 and a.shape[2] == 1:
                a = np.repeat(a, 3, axis=2)
            if a.ndim != 3 or a.shape[2] != 3:
                raise InvalidInputError(f"image: expected HxWx3 RGB pixels, got shape {a.shape}")
            return a
        if source == "bytes":
            return segmentation.read_image(bytes(value))
        path = str(value)
        if _is_uri(path) or self._filesystem is not None:
            fs, p = self._input_fs(path)
            with fs.open_input_stream(p) as f:
                return segmentation.read_image(f.read())
        return segmentation.read_image(path)  # the CLI's own file decoding

    def _input_fs(self, path: str) -> tuple[pafs.FileSystem, str]:
        if self._filesystem is not None:
            return self._filesystem, path
        # One filesystem object per scheme and host/bucket: S3 and GCS resolve a bucket's
        # region when one is made, which is not to be paid per image.
        scheme, rest = path.split("://", 1)
        host = rest.split("/", 1)[0]
        hit = self._fs_cache.get((scheme, host))
        if hit is not None:
            return hit[0], rest[len(hit[1]):]
        fs, p = pafs.FileSystem.from_uri(path)
        strip = "" if p == rest else host if p == rest[len(host):] else None
        if strip is not None:
            self._fs_cache[(scheme, host)] = (fs, strip)
        return fs, p

    def _write(self, labels: np.ndarray, path: Any, name: Any) -> str:
        assert self._out is not None
        fs, base, prefix = self._out
        if name is None or name == "":
            if path is None or path == "":
                raise ValueError("cannot name the label PNG: the row has neither 'name' nor 'path'")
            name = _default_name(str(path), self._root)
        target = posixpath.join(base, f"{name}{LABELS_SUFFIX}")
        _write_file(fs, target, _png_gray8(labels))
        return prefix + target


def segment_dataset(ds: ray.data.Dataset, model: str, *, batch_size: int = 8,
                    concurrency: int | tuple[int, int] | None = None, num_gpus: float = 0,
                    num_cpus: float | None = None, max_restarts: int = -1,
                    max_task_retries: int = 3, output: str | None = None,
                    segmenter_cls: type[SapiensSegmenter] = SapiensSegmenter,
                    **segmenter_kwargs: Any) -> ray.data.Dataset:
    """``ds.map_batches`` with :class:`SapiensSegmenter` on an actor pool; returns the (lazy)
    dataset of results (see the module's docstring for the columns).

    Args:
        ds: rows with ``image``, ``bytes`` or ``path`` (and optionally ``name``).
        model: a card id or a checkpoint path (made absolute here when it is a local file).
        batch_size: images per network call (per actor).
        concurrency: the actor pool: ``n`` actors, or ``(min, max)`` to autoscale; ``None``:
            Ray Data's default (from one to as many as the cluster's resources allow). Each
            actor holds one copy of the model. A fixed pool whose actors take every CPU of the
            cluster leaves none for Ray's read tasks (``read_binary_files``, ...), and the
            job waits forever: leave a CPU free, or let the pool autoscale.
        num_gpus, num_cpus: per actor, as Ray reserves them.
        max_restarts: how often Ray restarts a crashed actor (-1: always).
        max_task_retries: how often a batch whose actor crashed is retried before the job
            fails (so an image that crashes the process every time cannot loop forever).
        output: folder or URI for label PNGs (a relative local folder is made absolute here,
            unless ``filesystem=`` is given).
        segmenter_cls: a subclass of :class:`SapiensSegmenter` to use instead.
        **segmenter_kwargs: for :class:`SapiensSegmenter` (``mode``, ``device``, ``dtype``,
            ``accept_noncommercial``, ``filesystem``, ``root``, ``return_labels``, ...).

    Example::

        out = segment_dataset(ray.data.read_binary_files("photos/", include_paths=True),
                              "model.pt2", output="labels/", batch_size=4, concurrency=2)
        bad = out.filter(lambda row: row["error"] is not None).take_all()
    """
    if isinstance(model, os.PathLike) or os.path.exists(model):
        model = os.path.abspath(os.fspath(model))
    if segmenter_kwargs.get("filesystem") is None:  # else paths are on that filesystem
        if output is not None:
            output = _absolute(output)
        if segmenter_kwargs.get("root") is not None:
            segmenter_kwargs["root"] = _absolute(segmenter_kwargs["root"])
    if concurrency is None:
        compute = ray.data.ActorPoolStrategy(min_size=1)
    elif isinstance(concurrency, tuple):
        compute = ray.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
    else:
        compute = ray.data.ActorPoolStrategy(size=concurrency)
    with warnings.catch_warnings():
        # map_batches has no named parameter for the actor fault-tolerance options in this
        # Ray version; they go through ray_remote_args, which warns about its future removal.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*")
        return ds.map_batches(
            segmenter_cls,
            fn_constructor_args=(model,),
            fn_constructor_kwargs=dict(segmenter_kwargs, output=output),
            batch_size=batch_size,
            batch_format="numpy",
            compute=compute,
            num_gpus=num_gpus if num_gpus else None,
            num_cpus=num_cpus,
            udf_modifying_row_count=False,
            max_restarts=max_restarts,
            max_task_retries=max_task_retries,
        )


# ---- naming ----------------------------------------------------------------------------------

def output_names(paths: Sequence[str], output_dir: str = ".") -> list[str]:
    """The CLI's output names for these inputs written into ``output_dir``, in this order: the
    library's own naming rule (``docs/cli-outputs.md``), so the two drivers name alike. A stem
    shared by several inputs is extended by their extensions, then by a hash of their paths.

    Example::

        output_names(["a/x.jpg", "b/x.png", "b/y.png"])   # ['x_jpg', 'x_png', 'y']
    """
    return _core.output_bases([os.fsencode(p) for p in paths], os.fsencode(output_dir))


def _stem(path: str) -> str:
    base = posixpath.basename(path.rstrip("/")) if _is_uri(path) else os.path.basename(path)
    stem, ext = os.path.splitext(base)
    return stem if stem else base


def _default_name(path: str, root: str | None) -> str:
    if root is None:
        return _stem(path)
    p = path.split("://", 1)[1] if _is_uri(path) else path
    r = root.split("://", 1)[1] if _is_uri(root) else root
    rel = posixpath.relpath(p, r) if _is_uri(path) else os.path.relpath(p, r)
    if rel.startswith(".."):
        return _stem(path)
    head, tail = os.path.split(rel)
    return posixpath.join(head.replace(os.sep, "/"), _stem(tail)) if head else _stem(tail)


# ---- files -----------------------------------------------------------------------------------

def _is_uri(s: str) -> bool:
    head, sep, _ = s.partition("://")
    return bool(sep) and head.isalnum() and len(head) > 1


def _absolute(location: str) -> str:
    location = os.fspath(location)
    return location if _is_uri(location) else os.path.abspath(location)


def _resolve(location: str,
             filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, path on it, prefix that turns such a path back into the URI)."""
    if filesystem is not None:
        return filesystem, location.rstrip("/") or location, ""
    if _is_uri(location):
        uri = location.rstrip("/")
        fs, path = pafs.FileSystem.from_uri(uri)
        if isinstance(fs, pafs.LocalFileSystem):  # file:///...
            return fs, path, ""
        prefix = uri[:len(uri) - len(path)] if uri.endswith(path) else uri.split("://")[0] + "://"
        return fs, path, prefix
    return pafs.LocalFileSystem(), os.path.abspath(location), ""


def _write_file(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    parent = posixpath.dirname(path)
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return
    if parent:
        try:
            fs.create_dir(parent, recursive=True)
        except OSError:
            pass  # object stores have no folders; a real error shows at the write below
    with fs.open_output_stream(path) as f:  # an object appears whole when the stream closes
        f.write(data)


def _png_gray8(a: np.ndarray) -> bytes:
    """An 8-bit greyscale PNG of ``a`` (no filter, zlib level 6): the pixels the CLI's label
    PNG holds, without needing OpenCV or PIL on the workers."""
    h, w = a.shape
    rows = np.zeros((h, w + 1), np.uint8)  # each row: filter type 0, then the pixels
    rows[:, 1:] = a

    def chunk(tag: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + tag + body
                + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b""))


# ---- small helpers -----------------------------------------------------------------------------

def _batch_len(batch: dict[str, np.ndarray]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def _objects(n: int) -> np.ndarray:
    # np.empty, not np.array(list): equal-shaped arrays must stay one object per row.
    return np.empty(n, dtype=object)


def _describe(e: BaseException) -> tuple[str, str]:
    """(code, message) of a row's failure; codes as the CLI's summary spells them."""
    from .errors import SapiensSegError

    if isinstance(e, SapiensSegError):
        code = e.code.label
    elif isinstance(e, MemoryError):
        code = "out_of_memory"
    elif isinstance(e, FileNotFoundError):
        code = "not_found"
    elif isinstance(e, OSError):
        code = "io_error"
    elif isinstance(e, (ValueError, TypeError)):
        code = "invalid_input"
    else:
        code = "internal_error"
    return code, str(e) or type(e).__name__


def _in_actor() -> bool:
    # Asked without starting Ray: outside a cluster these calls would start a local one.
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def _actor_device() -> str:
    """``cuda:N`` for the first GPU Ray assigned to this actor, else ``cpu``."""
    ids = [str(i) for i in ray.get_gpu_ids()] if _in_actor() else []
    if not ids:
        return "cpu"
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if visible:  # Ray narrowed the visible devices: index within them
        return f"cuda:{visible.index(ids[0])}" if ids[0] in visible else "cuda:0"
    return f"cuda:{ids[0]}"


def _assigned_cpus() -> int:
    """The CPUs Ray reserved for this actor (at least 1); 0 (one thread per core, the library's
    default) outside an actor."""
    if not _in_actor():
        return 0
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0)
    return max(1, int(math.floor(cpus)))


# ---- the command -----------------------------------------------------------------------------

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
    p.add_argument("-m", "--model", default="sapiens-seg-0.3b-goliath",
                   help="card id or checkpoint path (default: %(default)s)")
    names = _core.option_names()  # the library's, as the CLI takes them
    p.add_argument("--mode", default=names["mode"][0], choices=names["mode"])
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: the actor's GPU when it has one)")
    p.add_argument("--dtype", default=None, choices=[n for n in names["dtype"] if n != "default"])
    p.add_argument("--normalization", default=names["normalization"][0],
                   choices=names["normalization"])
    p.add_argument("--batch-size", type=int, default=4, help="images per network call")
    p.add_argument("--concurrency", type=int, default=None,
                   help="actors (each holds a copy of the model; default: as many as fit)")
    p.add_argument("--gpus-per-actor", type=float, default=0.0,
                   help="GPUs reserved per actor (an actor with one runs on it)")
    p.add_argument("--cpus-per-actor", type=float, default=None,
                   help="CPUs reserved per actor (default: 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="LibTorch CPU threads per actor (default: its CPUs)")
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
    p.add_argument("--accept-noncommercial", action="store_true",
                   help="accept the CC-BY-NC-4.0 licence of the Sapiens v1 weights")
    p.add_argument("--allow-unverified", action="store_true",
                   help="load weights whose card has no pinned SHA-256")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    return p


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
    for item, _video in x["items"]:
        if not _is_uri(item):
            found.append(item)
            continue
        try:
            fs, p, prefix = _resolve(item, None)
            info = fs.get_file_info(p)
        except (pa.ArrowException, OSError, ValueError) as e:
            failed.append((item, "io_error", f"cannot open {item}: {e}"))
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
            failed.append((item, "not_found", f"input not found: {item}"))
    return found, failed


def _precheck(model: str, accept_noncommercial: bool, local: bool) -> tuple[int, str] | None:
    """Fails fast in the driver, before any actor starts, on what would fail every actor. The
    card lookup (``id@revision`` included) and the licence gate are the library's own."""
    from . import find_card
    from .errors import LicenseNotAcceptedError, WeightsNotFoundError

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
    if args.batch_size < 1:
        print("sapiens-seg-ray: --batch-size must be at least 1", file=sys.stderr)
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
            return_labels=False, mode=args.mode, device=args.device, dtype=args.dtype,
            normalization=args.normalization, accept_noncommercial=args.accept_noncommercial,
            allow_unverified=args.allow_unverified, threads=args.threads)
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
    from .__main__ import find_cli

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
    from . import errors

    text = str(e)
    m = re.search(r"sapiens_seg\.errors\.(\w+): (.*)", text, re.S)
    if m:
        cls = getattr(errors, m.group(1), None)
        if isinstance(cls, type) and issubclass(cls, errors.SapiensSegError):
            return cls.code.label, m.group(2).strip()
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "internal_error", lines[-1] if lines else type(e).__name__


def _write_summaries(ds: ray.data.Dataset | None, failed: list[tuple[str, str, str]],
                     fs: pafs.FileSystem, base: str, model: str) -> tuple[int, int, int]:
    """Streams the results into summary.parquet and summary.json; returns (exit status, ok,
    failed)."""
    import pyarrow.parquet as pq
    from . import __version__

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


if __name__ == "__main__":
    # Run through the importable module, so that Ray pickles SapiensSegmenter by reference
    # (sapiens_seg.ray.SapiensSegmenter) rather than as a class of __main__.
    from sapiens_seg import ray as _this

    sys.exit(_this.main())
