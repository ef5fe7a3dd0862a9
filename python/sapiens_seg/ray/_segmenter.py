"""The per-actor callable and the Ray Data entry point: a batch of rows in, labels and
per-image statistics out."""

from __future__ import annotations

import math
import os
import posixpath
import warnings
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import ray
import ray.data

from .. import _core
from ..errors import ErrorCode
from ._storage import _absolute, _is_uri, _resolve, _write_file

LABELS_SUFFIX: str = next(suffix for _, key, suffix, _ in _core.output_kinds()
                         if key == "labels_png")
"""What follows an image's name in its label PNG's name (as the CLI's ``--save labels``)."""

_INPUT_COLUMNS = ("image", "bytes")  # dropped from the output (large)


class SapiensSegmenter:
    """A callable class for :meth:`ray.data.Dataset.map_batches` (``batch_format="numpy"``):
    loads the model once per actor, then segments each batch in one library call.

    Args:
        model: a card id (``"sapiens-seg-0.3b-goliath"``) or a checkpoint path readable on every
            node (absolute: actors do not share the driver's working folder).
        **options: the library's options by name, as :func:`sapiens_seg.segmentation.load`
            takes them (``mode``, ``dtype``, ``normalization``, ``accept_noncommercial``,
            ``pipeline``, ``cubic``, ``input_height``, ...). Two have an actor's own meaning
            when left at their defaults: ``device`` (``None`` or ``""``: the GPU Ray assigned to
            this actor, else the CPU) and ``threads`` (``None`` or ``0``: the number of CPUs Ray
            assigned to the actor).
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

    def __init__(self, model: str, *, output: str | None = None,
                 filesystem: pafs.FileSystem | None = None, root: str | None = None,
                 return_labels: bool = True, **options: Any) -> None:
        from .. import segmentation

        device, threads = options.pop("device", None), options.pop("threads", None)
        self.device = device if device else _actor_device()
        self.threads = threads if threads else _assigned_cpus()
        self.model = segmentation.load(model, device=self.device, threads=self.threads, **options)
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

        # The library's two halves: each row prepared (decoded, resized, normalised) on its own,
        # so a bad image fails its row only, then what was prepared run as one network batch
        # (Ray's batch is the network batch: map_batches(batch_size=)).
        prepared: list[Any] = [None] * n
        errors: list[tuple[str, str] | None] = [None] * n
        for i in range(n):
            try:
                prepared[i] = self.model.prepare(self._item(source, batch[source][i]))
            except Exception as e:  # noqa: BLE001 - recorded in the row
                errors[i] = _describe(e)
        results: list[Any] = [None] * n
        todo = [i for i in range(n) if prepared[i] is not None]
        try:
            for i, r in zip(todo, self.model.run([prepared[i] for i in todo])):
                results[i] = r
        except Exception:  # noqa: BLE001 - a failed batch (out of memory, ...) ...
            for i in todo:  # ... must not cost every row: again one at a time
                try:
                    results[i] = self.model.run([prepared[i]])[0]
                except Exception as e:  # noqa: BLE001
                    errors[i] = _describe(e)
        del prepared

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

    def _item(self, source: str, value: Any) -> Any:
        """What the model is given for one row: pixels, encoded bytes or a local path (the
        library decodes files and bytes as the CLI does); a URI's bytes are read here."""
        from ..errors import InvalidInputError

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
            return bytes(value)
        path = str(value)
        if _is_uri(path) or self._filesystem is not None:
            fs, p = self._input_fs(path)
            with fs.open_input_stream(p) as f:
                return f.read()
        return path  # the CLI's own file decoding

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
        _write_file(fs, target, _core.encode_labels_png(labels))
        return prefix + target


def segment_dataset(ds: ray.data.Dataset, model: str, *, batch_size: int | None = None,
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
        batch_size: images per network call (per actor); ``None``: the library's default
            (``segmentation.DEFAULT_BATCH_SIZE``).
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
        **segmenter_kwargs: for :class:`SapiensSegmenter` (the library's options by name:
            ``mode``, ``device``, ``dtype``, ``accept_noncommercial``, ...; and ``filesystem``,
            ``root``, ``return_labels``).

    Example::

        out = segment_dataset(ray.data.read_binary_files("photos/", include_paths=True),
                              "model.pt2", output="labels/", batch_size=4, concurrency=2)
        bad = out.filter(lambda row: row["error"] is not None).take_all()
    """
    if batch_size is None:
        from ..segmentation import DEFAULT_BATCH_SIZE
        batch_size = DEFAULT_BATCH_SIZE
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


def _batch_len(batch: dict[str, np.ndarray]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def _objects(n: int) -> np.ndarray:
    # np.empty, not np.array(list): equal-shaped arrays must stay one object per row.
    return np.empty(n, dtype=object)


def _describe(e: BaseException) -> tuple[str, str]:
    """(code, message) of a row's failure; codes as the CLI's summary spells them."""
    from ..errors import SapiensSegError

    if isinstance(e, SapiensSegError):
        code = e.code.label
    elif isinstance(e, MemoryError):
        code = ErrorCode.OUT_OF_MEMORY.label
    elif isinstance(e, FileNotFoundError):
        code = ErrorCode.NOT_FOUND.label
    elif isinstance(e, OSError):
        code = ErrorCode.IO.label
    elif isinstance(e, (ValueError, TypeError)):
        code = ErrorCode.INVALID_INPUT.label
    else:
        code = ErrorCode.INTERNAL.label
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

