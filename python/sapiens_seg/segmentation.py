"""Sapiens body-part segmentation: load a model once, then call it on images.

Example::

    from sapiens_seg import segmentation

    model = segmentation.load("sapiens-seg-0.3b-goliath", accept_noncommercial=True)
    result = model("photo.jpg")
    result.labels          # numpy uint8 [H, W]: class index per pixel
    result.classes[3]      # 'Hair'
    result.backend         # Backend(mode='portable', device='cpu', dtype='float32')
    result.overlay()       # numpy uint8 [H, W, 3]: palette colours over the photo

    # Several images (of any sizes), in network batches of ``batch_size`` (default 4):
    results = model(["a.jpg", pathlib.Path("b.png"), pathlib.Path("c.jpg").read_bytes()])

    # Sapiens2 (29 classes, commercial use allowed), by card id or .safetensors path:
    model2 = segmentation.load("sapiens2-seg-0.4b")
    model2("photo.jpg").classes[2]   # 'Eyeglass'

Accepted images: a path (``str`` or ``os.PathLike``), encoded bytes (JPEG, PNG, ...), a numpy
``HxWx3`` uint8 RGB array (any strides), a PIL image (converted with ``convert("RGB")``) or a
torch uint8 ``HWC`` tensor. Files and bytes are decoded as ``cv2.imread`` does in the authors'
demo: EXIF orientation applied, grey replicated, alpha dropped, 16-bit reduced to 8 bits. Both
sides of an image must be at least 32 pixels.

Threads: a :class:`Model` is immutable after :func:`load`; calling it from several Python
threads at once is safe in every mode and device, and the GIL is released while the library
decodes and segments, so threads do run in parallel. CPU operators use LibTorch's intra-op
thread pool, whose size (``threads=``) is process-wide.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
import warnings as _warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, overload

import numpy as np

from . import _core
from ._progress import DownloadProgress, ProgressArg, make_reporter
from .errors import DecodeWarning, InvalidInputError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Backend", "DownloadProgress", "Model", "ModelInfo", "OPTION_SPECS", "Prepared",
           "Result", "download", "load", "option_default", "read_image", "resize"]

# The option names are the library's (sapiens_seg/names.hpp), as the CLI takes them. A dtype
# given as None is the library's "default".
_OPTION_NAMES = _core.option_names()
_MODES = tuple(_OPTION_NAMES["mode"])
_DTYPES = tuple(n for n in _OPTION_NAMES["dtype"] if n != "default")
_INTERPOLATIONS = ("linear", "area", "cubic")
_CUBICS = tuple(_OPTION_NAMES["cubic"])
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")

# Every option of the library, by its table (sapiens_seg/names.hpp option_specs): load()'s and
# Model.__call__'s keyword arguments are made from these rows, so an option added to the C++
# table is a keyword here with the same name and default, as it is a flag of the CLI.
OPTION_SPECS: tuple[dict[str, Any], ...] = tuple(_core.option_specs())
_SPEC = {s["name"]: s for s in OPTION_SPECS}
_LOAD_OPTIONS = tuple(s["name"] for s in OPTION_SPECS if s["group"] == "load")
_SEGMENT_OPTIONS = tuple(s["name"] for s in OPTION_SPECS if s["group"] == "segment")
_RUN_OPTIONS = tuple(s["name"] for s in OPTION_SPECS if s["group"] == "run")


def option_default(name: str) -> Any:
    """The library's default of an option, as a Python value (bool, int or str)."""
    spec = _SPEC[name]
    text = spec["default"]
    if spec["type"] == "bool":
        return text == "true"
    if spec["type"] == "int":
        return int(text)
    return text


DEFAULT_BATCH_SIZE: int = option_default("batch_size")
"""Images per network call for a list, unless ``load(batch_size=)`` or the call says otherwise
(the library's RunOptions default, the same in the CLI, the Ray driver and the server)."""


def _option_text(name: str, value: Any) -> str:
    """An option's Python value checked against the library's table and written as its text."""
    spec = _SPEC[name]
    kind = spec["type"]
    if kind == "bool":
        return "true" if _check_bool(value, name) else "false"
    if kind == "int":
        v = _check_int(value, name, minimum=spec["min"])
        if v > spec["max"]:
            raise ValueError(f"{name}: must be at most {spec['max']}, got {v}")
        return str(v)
    if kind == "choice":
        return _check_choice(value, name, spec["choices"])
    if name == "device":
        return _device_arg(value)
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, got {type(value).__name__}")
    return value


def _options_text(values: dict[str, Any], names: Sequence[str], where: str) -> dict[str, str]:
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise TypeError(f"{where}: unexpected keyword argument(s) {', '.join(unknown)} (options: "
                        f"{', '.join(names)})")
    return {k: _option_text(k, v) for k, v in values.items()}


class Backend(NamedTuple):
    """What ran the network: ``Backend(mode='portable', device='cpu', dtype='float32')``."""

    mode: str
    """``'portable'``, ``'kernels'`` or ``'original'``."""
    device: str
    """``'cpu'``, ``'cuda:0'``, ..."""
    dtype: str
    """``'float32'``, ``'float16'`` or ``'bfloat16'``."""


@dataclass(frozen=True)
class ModelInfo:
    """What :func:`load` loaded (``model.info``)."""

    id: str
    """Card id, or the file name for a bare checkpoint path."""
    family: str
    """``'sapiens-v1'``."""
    path: str
    """The checkpoint file that was loaded."""
    sha256: str
    """The verified SHA-256 (``''`` when the file was not verified against a card)."""
    license: str
    """The card's licence id (``''`` for a bare path)."""
    input_size: tuple[int, int]
    """Network input (height, width)."""
    num_classes: int
    embed_dim: int
    depth: int
    heads: int
    backend: Backend
    classes: tuple[str, ...]
    """The class names, index 0 the background (what ``Result.classes`` holds)."""
    palette: tuple[tuple[int, int, int], ...]
    """The RGB colour of each class (as ``Card.palette``; ``Result.palette`` is the array)."""


class Result:
    """The segmentation of one image.

    Attributes:
        labels: numpy uint8 ``[H, W]``, the class index of every pixel, at the image's size
            (after EXIF rotation). A read-only view of the library's own buffer (no copy); use
            ``labels.copy()`` to modify it.
        logits: numpy float32 ``[C, H, W]`` when the model was loaded (or called) with
            ``logits=True``, else ``None``. Read-only, no copy.
        raw_logits: numpy float32 ``[C, h, w]``, the network's own output before any resize,
            with ``raw_logits=True``, else ``None``.
        foreground: numpy bool ``[H, W]``, ``labels > 0`` (what the authors' demo saves as
            ``<name>.npy``).
        classes: the class names; ``classes[0]`` is the background.
        palette: numpy uint8 ``[C, 3]``, the RGB colour of each class.
        backend: the :class:`Backend` that ran the network.
        timings: milliseconds per stage, as the C++ ``Timings`` defines them for every caller:
            ``decode``, ``preprocess``, ``network`` (the whole batch's network call),
            ``postprocess`` and ``total`` (their sum).
        warnings: what the image decoder warned about for a file or bytes it still decoded, as
            cv2.imread decodes them (e.g. ``"libjpeg: Corrupt JPEG data: bad Huffman code"``);
            also logged. Empty for a clean file and for pixels.

    Example::

        r = model("photo.jpg")
        hair = r.labels == r.classes.index("Hair")
        cv2.imwrite("overlay.png", r.overlay(opacity=0.6)[:, :, ::-1])   # RGB -> BGR
    """

    __slots__ = ("_native", "_image", "_labels", "_logits", "_raw_logits", "_classes", "_palette",
                 "_backend", "_timings", "_foreground", "_warnings")

    def __init__(self, native: _core.NativeResult, image: np.ndarray | None) -> None:
        # Not meant to be built by users: Model.__call__ makes them.
        self._native = native
        self._image = image  # the caller's array when the input was pixels, else None
        self._labels: np.ndarray = native.labels
        self._logits: np.ndarray | None = native.logits
        self._raw_logits: np.ndarray | None = native.raw_logits
        self._classes: list[str] = native.classes
        self._palette: np.ndarray = native.palette
        self._palette.setflags(write=False)
        self._backend = Backend(*native.backend)
        self._timings: dict[str, float] = native.timings
        self._foreground: np.ndarray | None = None
        self._warnings: list[str] = native.warnings

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    @property
    def logits(self) -> np.ndarray | None:
        return self._logits

    @property
    def raw_logits(self) -> np.ndarray | None:
        return self._raw_logits

    @property
    def foreground(self) -> np.ndarray:
        fg = self._foreground
        if fg is None:
            fg = self._labels != 0
            fg.setflags(write=False)
            self._foreground = fg
        return fg

    @property
    def classes(self) -> list[str]:
        return list(self._classes)

    @property
    def palette(self) -> np.ndarray:
        return self._palette

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def timings(self) -> dict[str, float]:
        return dict(self._timings)

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)

    @property
    def height(self) -> int:
        """The image's height in pixels (``labels.shape[0]``)."""
        return int(self._labels.shape[0])

    @property
    def width(self) -> int:
        """The image's width in pixels (``labels.shape[1]``)."""
        return int(self._labels.shape[1])

    def overlay(self, opacity: float = 0.5) -> np.ndarray:
        """The palette colours blended over the image, as numpy uint8 ``[H, W, 3]`` RGB.

        ``out = image * (1 - opacity) + colour * opacity``, truncated to 8 bits, as the
        authors' visualisation does (and as the CLI's ``<name>_overlay.png``). For an input
        given as pixels (numpy, PIL, torch), the blend uses that array as it is now.

        Example::

            Image.fromarray(model("photo.jpg").overlay(0.5)).save("overlay.png")
        """
        if isinstance(opacity, bool) or not isinstance(opacity, numbers.Real):
            raise TypeError(f"opacity: expected a number in [0, 1], got {type(opacity).__name__}")
        opacity = float(opacity)
        if not (0.0 <= opacity <= 1.0) or math.isnan(opacity):
            raise ValueError(f"opacity: must be in [0, 1], got {opacity}")
        return self._native.overlay(self._image, opacity)

    def __repr__(self) -> str:
        return (f"Result({self.width}x{self.height}, {len(self._classes)} classes, "
                f"logits={'yes' if self._logits is not None else 'no'}, backend={self._backend})")


class Model:
    """A loaded segmentation model; call it on an image or a list of images.

    Made by :func:`load`. Immutable: calling one model from several threads at once is safe (in
    every mode and on every device), and the GIL is released during decoding and inference.

    Example::

        model = segmentation.load("model.pt2")
        r = model("photo.jpg")                     # -> Result
        rs = model([img_array, pil_image])         # -> [Result, Result]
        r = model("photo.jpg", logits=True)        # logits for this call only
        rs = model(paths, batch_size=16)           # 16 images per network call
    """

    __slots__ = ("_native", "_segment", "_batch_size", "_info")

    def __init__(self, native: _core.Model, segment_options: dict[str, str],
                 batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        # Use segmentation.load() to make one.
        self._native = native
        self._segment = segment_options
        self._batch_size = batch_size
        i = native.info
        self._info = ModelInfo(
            id=i["id"], family=i["family"], path=i["path"], sha256=i["sha256"],
            license=i["license"], input_size=(i["input_height"], i["input_width"]),
            num_classes=i["num_classes"], embed_dim=i["embed_dim"], depth=i["depth"],
            heads=i["heads"], backend=Backend(*i["backend"]), classes=tuple(i["classes"]),
            palette=tuple(tuple(int(v) for v in rgb) for rgb in i["palette"].tolist()))

    @property
    def info(self) -> ModelInfo:
        """The card id, checkpoint, verified hash, licence, architecture and backend."""
        return self._info

    @property
    def backend(self) -> Backend:
        """The backend every call runs on."""
        return self._info.backend

    @property
    def batch_size(self) -> int:
        """Images per network call when the model is called on a list (``load(batch_size=)``)."""
        return self._batch_size

    @overload
    def __call__(self, x: list[Any] | tuple[Any, ...], *, logits: bool | None = None,
                 batch_size: int | None = None, **options: Any) -> list[Result]: ...

    @overload
    def __call__(self, x: Any, *, logits: bool | None = None,
                 batch_size: int | None = None, **options: Any) -> Result: ...

    def __call__(self, x: Any, *, logits: bool | None = None, batch_size: int | None = None,
                 **options: Any) -> Result | list[Result]:
        """Segments one image (returns a :class:`Result`) or a list of images (returns a list in
        the same order).

        A list is split into network batches of ``batch_size`` images (default: the model's,
        ``load(batch_size=)``, 4 unless set), so memory stays flat for a list of any length:
        only one batch's images are decoded and on the network at a time (the results, with
        their labels and the decoded pixels ``Result.overlay`` needs, are kept). Results do not
        depend on the batch size. ``logits`` (and the other segment options, e.g.
        ``raw_logits``) override the model's ``load()`` settings for this call.

        Raises :class:`~sapiens_seg.InvalidInputError` (also a ``ValueError``) for an image that
        cannot be segmented (in a list, the message starts with the item, ``x[3]: ...``),
        :class:`~sapiens_seg.WeightsNotFoundError` for a missing file,
        :class:`~sapiens_seg.OutOfMemoryError` (also a ``MemoryError``) when a batch does not
        fit in memory, and ``TypeError`` for an unsupported kind of object. An error in a list
        stops the call (no partial list is returned).
        """
        seg = dict(self._segment)
        if logits is not None:
            options["logits"] = logits
        seg.update(_options_text(options, _SEGMENT_OPTIONS, "Model.__call__"))
        size = self._batch_size if batch_size is None else int(
            _option_text("batch_size", batch_size))
        if isinstance(x, (list, tuple)):
            items = [_to_item(v, f"x[{i}]") for i, v in enumerate(x)]
            if not items:
                return []
        else:
            items = [_to_item(x, "x")]
        is_list = isinstance(x, (list, tuple))
        results: list[Result] = []
        for start in range(0, len(items), size):
            chunk = items[start:start + size]
            # A failed item of a list names itself by its index in the list ("x[12]: ...").
            natives = self._native.segment([item for item, _ in chunk], seg,
                                           start if is_list else -1)
            results.extend(Result(n, image) for n, (_, image) in zip(natives, chunk))
        return results if isinstance(x, (list, tuple)) else results[0]

    def prepare(self, x: Any) -> Prepared:
        """The first half of a call, for one image: decoded, resized and normalised for this
        model (the library's ``Model::prepare``; the GIL is released). Hand a list of them to
        :meth:`run` as one network batch: a server or a data pipeline prepares images where
        they arrive (many threads) and batches them in one place.

        Example::

            ready = [model.prepare(p) for p in paths]   # e.g. on a thread pool
            results = model.run(ready)                  # one network call
        """
        item, image = _to_item(x, "x")
        return Prepared(self._native.prepare(item), image)

    def run(self, prepared: Sequence[Prepared], **options: Any) -> list[Result]:
        """The second half: the prepared images of this model as one network batch (the
        library's ``Model::run``; the GIL is released). Results equal those of calling the
        model on the same images, whatever the batch holds. A successful run releases each
        image's network input (its pixels stay, for ``Result.overlay``), so a :class:`Prepared`
        runs once; a run that raised leaves them, to run again. ``options``: the segment
        options (``logits``, ``raw_logits``) for this call."""
        seg = dict(self._segment)
        seg.update(_options_text(options, _SEGMENT_OPTIONS, "Model.run"))
        items = list(prepared)
        for i, p in enumerate(items):
            if not isinstance(p, Prepared):
                raise TypeError(f"prepared[{i}]: expected a Prepared (Model.prepare), got "
                                f"{type(p).__name__}")
        natives = self._native.run([p._native for p in items], seg)
        return [Result(n, p._image) for n, p in zip(natives, items)]

    def __repr__(self) -> str:
        return f"Model({self._info.id!r}, backend={self._info.backend})"


class Prepared:
    """One image decoded, resized and normalised for a model (:meth:`Model.prepare`), waiting
    for :meth:`Model.run`. Holds the decoded pixels and the network input (about 9 MB at
    1024x768)."""

    __slots__ = ("_native", "_image")

    def __init__(self, native: _core.Prepared, image: np.ndarray | None) -> None:
        self._native = native
        self._image = image  # the caller's array when the input was pixels

    @property
    def height(self) -> int:
        return int(self._native.height)

    @property
    def width(self) -> int:
        return int(self._native.width)

    @property
    def timings(self) -> dict[str, float]:
        """``decode`` and ``preprocess`` so far, in milliseconds (see :class:`Result`)."""
        return dict(self._native.timings)

    @property
    def warnings(self) -> list[str]:
        return list(self._native.warnings)

    def __repr__(self) -> str:
        return f"Prepared({self.width}x{self.height})"


def load(name_or_path: str | os.PathLike[str], mode: str = "auto", device: Any = None,
         dtype: Any = None, logits: bool = False, *, input_size: tuple[int, int] | None = None,
         progress: ProgressArg = None, **options: Any) -> Model:
    """Loads a Sapiens segmentation model.

    Args:
        name_or_path: a model card id (``"sapiens-seg-0.3b-goliath"``, ``"sapiens2-seg-0.4b"``,
            see :func:`sapiens_seg.list_cards`) or the path of a checkpoint (a Sapiens v1
            ``.pt2`` or a Sapiens2 ``.safetensors``, in the authors' or the Hugging Face
            transformers naming). Weights of a
            card are looked up in ``SAPIENS_SEG_WEIGHTS_PATH``, the sapiens-seg cache and the
            Hugging Face cache, and checked against the card's SHA-256.
        mode: ``"auto"`` (``"portable"`` today on every device: it would take ``"kernels"`` only
            where a model card records a measurement preferring them, and none does yet),
            ``"portable"`` (the network on LibTorch
            operators), ``"kernels"`` (the project's CUDA kernels) or ``"original"`` (the
            checkpoint's own TorchScript graph; Sapiens v1 only). A mode that cannot run raises
            :class:`~sapiens_seg.BackendUnavailableError`; nothing falls back silently.
        device: ``None`` (CUDA when present, else the CPU), ``"cpu"``, ``"cuda"``,
            ``"cuda:N"`` or a ``torch.device``.
        dtype: ``None`` (float32 on the CPU, float16 on CUDA), ``"float32"``, ``"float16"``,
            ``"bfloat16"`` or the matching ``torch.dtype``.
        logits: also return ``Result.logits`` (``[C, H, W]`` float32; large: 28 x 12 MP is
            1.3 GB).
        input_size: shorthand for ``input_height`` and ``input_width``: the network input
            ``(height, width)`` instead of the checkpoint's.
        progress: what a download of missing weights shows (see :func:`download`): ``None``
            a bar on a terminal or in a notebook, ``True`` always a bar, ``False`` none, or a
            callable given :class:`DownloadProgress` tuples (returning ``False`` cancels).
        **options: every other option of the library by its name (the CLI's flags, with
            underscores), listed below with its default; :data:`OPTION_SPECS` has the table.

    Returns:
        A :class:`Model`; the GIL is released while it loads.

    Raises:
        ValueError, TypeError: an invalid argument (the message names it).
        WeightsNotFoundError, ChecksumError, LicenseNotAcceptedError, BackendUnavailableError,
        CheckpointFormatError, ...: see :mod:`sapiens_seg.errors`.
        KeyboardInterrupt: Ctrl-C during a download (the partial file is kept and resumed by
        the next call).

    Example::

        model = segmentation.load("build/fixtures/tiny_b_torchscript.pt2", mode="portable",
                                  device="cpu", threads=2, batch_size=8)
        model("examples/astronaut.jpg").backend
        # Backend(mode='portable', device='cpu', dtype='float32')
    """
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if isinstance(name_or_path, bytes):
        name_or_path = os.fsdecode(name_or_path)
    if not isinstance(name_or_path, str):
        raise TypeError("name_or_path: expected a card id or a path (str or os.PathLike), got "
                        f"{type(name_or_path).__name__}")
    if not name_or_path:
        raise ValueError("name_or_path: is empty")
    if input_size is not None:
        if not isinstance(input_size, (tuple, list)) or len(input_size) != 2:
            raise TypeError("input_size: expected None or a (height, width) pair")
        if "input_height" in options or "input_width" in options:
            raise TypeError("input_size: give it or input_height/input_width, not both")
        options["input_height"], options["input_width"] = input_size
        for k in ("input_height", "input_width"):
            _check_int(options[k], "input_size", minimum=1)
    options.update(mode=mode, device=device, dtype=_dtype_arg(dtype), logits=logits)
    unknown = sorted(set(options) - set(_SPEC))
    if unknown:
        raise TypeError(f"load: unexpected keyword argument(s) {', '.join(unknown)} (options: "
                        f"{', '.join(_SPEC)}, input_size, progress)")

    def group(names: Sequence[str]) -> dict[str, str]:
        return _options_text({k: v for k, v in options.items() if k in names}, names, "load")

    load_opts, seg_opts, run_opts = group(_LOAD_OPTIONS), group(_SEGMENT_OPTIONS), group(
        _RUN_OPTIONS)
    batch_size = int(run_opts.get("batch_size", DEFAULT_BATCH_SIZE))
    reporter = make_reporter(progress)
    try:
        native = _core.load(os.fsencode(name_or_path), load_opts, reporter)
    finally:
        if reporter is not None:
            reporter.close()
    return Model(native, seg_opts, batch_size)


def _options_doc() -> str:
    lines = ["", "    Options (keyword arguments, from the library's table):", ""]
    for spec in OPTION_SPECS:
        if spec["name"] in ("mode", "device", "dtype", "logits"):
            continue
        default = option_default(spec["name"])
        lines.append(f"        {spec['name']} (default {default!r}): {spec['help']}")
    return "\n".join(lines) + "\n"


load.__doc__ = (load.__doc__ or "") + _options_doc()


def download(name: str, *, progress: ProgressArg = None) -> str:
    """Makes a model card's checkpoint present and verified (downloading it when it is not on
    this machine) without loading it, and returns its path.

    The file is looked up, fetched and checked as :func:`load` does (``SAPIENS_SEG_WEIGHTS_PATH``,
    the sapiens-seg cache, the Hugging Face cache, then ``HF_ENDPOINT``; SHA-256 against the
    card). A transfer goes to ``<file>.part`` and resumes from there after an interruption, a
    dropped connection or Ctrl-C. No licence acceptance is needed to download; loading Sapiens
    v1 weights still needs it.

    Args:
        name: a card id (``"sapiens-seg-1b-goliath"``, see :func:`sapiens_seg.list_cards`).
        progress: ``None`` (default): a tqdm bar when stderr is a terminal or in a Jupyter
            notebook (``tqdm.auto``), none otherwise or with ``HF_HUB_DISABLE_PROGRESS_BARS=1``;
            ``True``: always a bar; ``False``: none; or a callable given
            :class:`DownloadProgress` ``(file, done, total, bytes_per_second)`` a few times a
            second, whose ``False`` return cancels (:class:`~sapiens_seg.DownloadError`).

    Raises:
        KeyboardInterrupt: Ctrl-C; the transfer stops within about a second and the ``.part``
            file is kept for the next call. An exception raised by a ``progress`` callable
            cancels the same way and propagates.
        WeightsNotFoundError, DownloadError, OfflineError, ChecksumError, SapiensIOError.

    Example::

        path = segmentation.download("sapiens2-seg-0.4b")           # bar on a terminal
        segmentation.download("sapiens2-seg-1b", progress=lambda p: print(p.done, p.total))
    """
    if isinstance(name, os.PathLike) or not isinstance(name, str):
        raise TypeError(f"name: expected a card id (str), got {type(name).__name__}")
    if not name:
        raise ValueError("name: is empty")
    reporter = make_reporter(progress)
    try:
        return _core.fetch(name.encode(), reporter)
    finally:
        if reporter is not None:
            reporter.close()


def read_image(x: str | os.PathLike[str] | bytes | bytearray | memoryview) -> np.ndarray:
    """Decodes an image file or encoded bytes to numpy uint8 ``[H, W, 3]`` RGB exactly as the
    model does (EXIF orientation, grey, alpha and 16-bit rules, size limits).

    What the decoder warned about for a file it still decoded (libjpeg's "Corrupt JPEG data:
    ...") is issued as a :class:`~sapiens_seg.DecodeWarning` (``Result.warnings`` for a model
    call).

    Example::

        rgb = segmentation.read_image("photo.jpg")
        assert model(rgb).labels.shape == rgb.shape[:2]
    """
    item, _ = _to_item(x, "x")
    if item[0] == _core.ITEM_RGB:
        raise TypeError("x: expected a path or encoded bytes")
    pixels, warned = _core.read_image(item)
    for text in warned:
        _warnings.warn(text, DecodeWarning, stacklevel=2)
    return pixels


def resize(image: np.ndarray, size: tuple[int, int], interpolation: str = "linear", *,
           cubic: str = "wheel", device: Any = None) -> np.ndarray:
    """``cv2.resize(image, (width, height), interpolation=...)`` of the opencv-python wheel, byte
    for byte, by the library's own arithmetic (no OpenCV call, so the bytes do not depend on the
    OpenCV installed): the resize the models apply before the network.

    Args:
        image: numpy ``HxWx3`` uint8 (RGB or BGR: the channels are resized alike; any strides).
        size: the output ``(height, width)`` (note: cv2 takes ``(width, height)``).
        interpolation: ``"linear"`` (``cv2.INTER_LINEAR``), ``"area"`` (``cv2.INTER_AREA``) or
            ``"cubic"`` (``cv2.INTER_CUBIC``).
        cubic: ``"wheel"`` (the x86-64 wheel's default cubic, Intel IPP's) or ``"opencv"``
            (OpenCV's own, as ``cv2.setUseOptimized(False)`` or a build without IPP gives).
        device: ``None`` runs the host code; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a
            ``torch.device``) run the device pipeline's tensor code there (the same bytes).

    Example::

        small = segmentation.resize(rgb, (1024, 768), "area")
        assert (small == cv2.resize(rgb, (768, 1024), interpolation=cv2.INTER_AREA)).all()
    """
    if not isinstance(image, np.ndarray):
        raise TypeError(f"image: expected a numpy HxWx3 uint8 array, got {type(image).__name__}")
    a = _rgb_array(image, "image")
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise TypeError("size: expected a (height, width) pair")
    h = _check_int(size[0], "size", minimum=1)
    w = _check_int(size[1], "size", minimum=1)
    interpolation = _check_choice(interpolation, "interpolation", _INTERPOLATIONS)
    cubic = _check_choice(cubic, "cubic", _CUBICS)
    return _core.resize(a, h, w, interpolation, cubic, _device_arg(device))


# ---- argument checking --------------------------------------------------------------------

def _check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    allowed = ", ".join(repr(c) for c in choices)
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {allowed}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    return value


def _check_bool(value: Any, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name}: expected True or False, got {type(value).__name__}")


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name}: must be at least {minimum}, got {value}")
    if value > 2**31 - 1:
        raise ValueError(f"{name}: too large ({value})")
    return value


def _device_arg(device: Any) -> str:
    if device is None:
        return ""
    if type(device).__module__ == "torch" and type(device).__name__ == "device":
        device = str(device)
    if not isinstance(device, str):
        raise TypeError("device: expected None, 'cpu', 'cuda', 'cuda:N' or a torch.device, got "
                        f"{type(device).__name__}")
    if not _DEVICE_RE.match(device):
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return device


def _dtype_arg(dtype: Any) -> str:
    if dtype is None or dtype == "default":
        return "default"
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        dtype = str(dtype).removeprefix("torch.")
    if not isinstance(dtype, str):
        raise TypeError("dtype: expected None, 'float32', 'float16', 'bfloat16' or a torch.dtype, "
                        f"got {type(dtype).__name__}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected None, {', '.join(map(repr, _DTYPES))}, got {dtype!r}")
    return dtype


# ---- inputs -------------------------------------------------------------------------------

def _rgb_array(a: np.ndarray, where: str) -> np.ndarray:
    """Checks an HxWx3 uint8 array; copies it only when its pixels are not packed RGB rows."""
    if a.dtype != np.uint8:
        raise TypeError(f"{where}: expected a uint8 RGB array, got dtype {a.dtype} "
                        "(convert with .astype(numpy.uint8) if the values are 0-255)")
    if a.ndim != 3 or a.shape[2] != 3:
        raise InvalidInputError(f"{where}: expected an HxWx3 RGB array, got shape {a.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise InvalidInputError(f"{where}: the image is empty ({a.shape[1]}x{a.shape[0]} pixels; "
                                "both sides must be at least 32)")
    s = a.strides
    if not (s[2] == 1 and s[1] == 3 and s[0] >= 3 * a.shape[1]):
        a = np.ascontiguousarray(a)
    return a


def _pil_rgb(img: Any, where: str) -> np.ndarray:
    """A PIL image as HxWx3 uint8 RGB by the rules files are decoded with: 16-bit samples
    (``I;16``, ``I;16L``, ``I;16B``, ``I;16N``) keep their high byte (value // 256, as cv2.imread
    reduces a 16-bit PNG), and so do ``I`` (32-bit integer, which is how Pillow holds many 16-bit
    files) and ``F`` (32-bit float) after clipping to 0..65535 (NaN as 0); grey is replicated.
    Every other mode goes through Pillow's ``convert("RGB")``: ``1`` as 0/255, ``L``, ``P`` by its
    palette, ``LA``/``PA``/``RGBA`` with the alpha dropped (not composited), ``CMYK``, ``YCbCr``.
    (Pillow's own ``convert("RGB")`` would clip 16-bit values to 255, turning a 16-bit photo
    nearly white.)"""
    mode = img.mode
    if mode == "RGB":
        return np.asarray(img)
    if mode.startswith("I;16") or mode in ("I", "F"):
        v = np.asarray(img)
        if v.ndim != 2:
            raise InvalidInputError(f"{where}: a PIL image in mode {mode} with shape {v.shape}")
        if mode in ("I", "F"):
            v = np.clip(np.nan_to_num(v, nan=0.0) if mode == "F" else v, 0, 65535)
        high = (v.astype(np.uint16) >> 8).astype(np.uint8)
        return np.repeat(high[:, :, None], 3, axis=2)
    try:
        return np.asarray(img.convert("RGB"))
    except ValueError as e:
        raise InvalidInputError(f"{where}: a PIL image in mode {mode} cannot be converted to RGB "
                                f"({e})") from e


def _to_item(x: Any, where: str) -> tuple[tuple[int, Any], np.ndarray | None]:
    """The native layer's (kind, payload) item for one image, and the pixels to keep for
    Result.overlay when the input was pixels (files and bytes are decoded natively)."""
    if isinstance(x, (str, os.PathLike)):
        path = os.fspath(x)
        raw = path if isinstance(path, bytes) else os.fsencode(path)
        if not raw:
            raise ValueError(f"{where}: the path is empty")
        return (_core.ITEM_FILE, raw), None
    if isinstance(x, (bytes, bytearray)):
        return (_core.ITEM_ENCODED, x), None
    if isinstance(x, memoryview):
        if not x.c_contiguous:
            raise ValueError(f"{where}: the memoryview of encoded bytes must be contiguous")
        return (_core.ITEM_ENCODED, x.cast("B")), None
    if isinstance(x, np.ndarray):
        a = _rgb_array(x, where)
        return (_core.ITEM_RGB, a), a
    pil = sys.modules.get("PIL.Image")
    if pil is not None and isinstance(x, pil.Image):
        a = _rgb_array(_pil_rgb(x, where), where)
        return (_core.ITEM_RGB, a), a
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dtype != torch.uint8:
            raise TypeError(f"{where}: expected a uint8 HWC tensor, got dtype {x.dtype}")
        if x.dim() != 3 or x.shape[2] != 3:
            raise InvalidInputError(
                f"{where}: expected an HxWx3 (HWC) tensor, got shape {tuple(x.shape)}"
                + (" (for CHW use .permute(1, 2, 0))" if x.dim() == 3 and x.shape[0] == 3 else ""))
        t = x.detach()
        if t.device.type == "meta":
            raise InvalidInputError(f"{where}: a tensor on the 'meta' device has no pixels (only "
                                    "a shape); make it on the CPU or a GPU")
        if t.layout != torch.strided:
            raise InvalidInputError(f"{where}: expected a dense tensor, got layout {t.layout} "
                                    "(use .to_dense())")
        if t.device.type != "cpu":
            t = t.cpu()
        a = _rgb_array(t.numpy(), where)
        return (_core.ITEM_RGB, a), a
    raise TypeError(f"{where}: expected a path, encoded bytes, a numpy HxWx3 uint8 array, a PIL "
                    f"image or a torch uint8 HWC tensor (or a list of them), got "
                    f"{type(x).__module__}.{type(x).__qualname__}")
