"""sapiens_seg: Meta's Sapiens human body-part segmentation on LibTorch, from Python.

The binding of the C++ library ``libsapiens_seg``; most users need only
:mod:`sapiens_seg.segmentation`::

    from sapiens_seg import segmentation

    model = segmentation.load("sapiens-seg-0.3b-goliath", accept_noncommercial=True)
    result = model("photo.jpg")
    print(result.labels.shape, result.backend)
    # (1024, 768) Backend(mode='portable', device='cpu', dtype='float32')

``segmentation.download(id)`` (also ``sapiens_seg.download``) fetches a card's weights without
loading them: a progress bar on a terminal or in a notebook; Ctrl-C stops it and the next call
resumes. Also here: the exception classes (:mod:`sapiens_seg.errors`), :func:`list_cards` (the
model cards), :func:`system_info` and ``__version__``. ``python -m sapiens_seg ARGS`` runs the
``sapiens-seg`` command line tool.
"""

from __future__ import annotations

from dataclasses import dataclass

# errors first: the native module looks its exception classes up there.
from .errors import (
    BackendUnavailableError,
    CheckpointFormatError,
    ChecksumError,
    DecodeWarning,
    DownloadError,
    ErrorCode,
    InternalError,
    InvalidInputError,
    LicenseNotAcceptedError,
    OfflineError,
    OutOfMemoryError,
    SapiensIOError,
    SapiensSegError,
    WeightsNotFoundError,
)
from . import _core
from ._log import get_log_level, log_to_python, log_to_stderr, set_log_level
from . import segmentation
from .segmentation import (
    Backend,
    DownloadProgress,
    Model,
    ModelInfo,
    Result,
    download,
    load,
    read_image,
    resize,
)

__version__: str = _core.version()


__all__ = [
    "__version__",
    "segmentation",
    "load",
    "forked_child",
    "download",
    "read_image",
    "resize",
    "find_card",
    "list_cards",
    "system_info",
    "set_log_level",
    "get_log_level",
    "log_to_python",
    "log_to_stderr",
    "Backend",
    "Card",
    "DownloadProgress",
    "Model",
    "ModelInfo",
    "Result",
    "SystemInfo",
    "ErrorCode",
    "DecodeWarning",
    "SapiensSegError",
    "WeightsNotFoundError",
    "ChecksumError",
    "DownloadError",
    "OfflineError",
    "LicenseNotAcceptedError",
    "BackendUnavailableError",
    "InvalidInputError",
    "CheckpointFormatError",
    "SapiensIOError",
    "InternalError",
    "OutOfMemoryError",
]


@dataclass(frozen=True)
class Card:
    """A model card (``cards/*.json``): where a checkpoint comes from, its pinned SHA-256, its
    licence, input size and labels."""

    id: str
    family: str
    description: str
    repo: str
    revision: str
    url: str
    file: str
    size: int | None
    sha256: str | None
    """Full lower-case hex, or None when no hash is pinned."""
    license: str
    license_url: str
    commercial_use: bool
    format: str
    input_size: tuple[int, int]
    num_classes: int
    classes: tuple[str, ...]
    palette: tuple[tuple[int, int, int], ...]
    """RGB per class."""
    source: str
    """The card file it was read from."""


@dataclass(frozen=True)
class SystemInfo:
    """Versions, CPU threads, CUDA devices and which backends can run on this machine."""

    version: str
    torch_version: str
    opencv_version: str
    openssl_version: str
    threads: int
    cuda_available: bool
    cuda_devices: int
    kernels_compiled: bool
    backends: tuple[str, ...]
    cpu_model: str
    """``model name`` of ``/proc/cpuinfo``."""
    cpu_id: str
    """Vendor, family, model and stepping from CPUID (``"AuthenticAMD family 25 model 1 stepping
    1"``): CPUs of one name span generations whose vector units differ."""
    cpu_flags: tuple[str, ...]
    """The ISA flags that decide the CPU dtypes (``avx2``, ``avx512_bf16``, ``amx_bf16``, ...)."""
    onednn_cap: str
    """``ONEDNN_MAX_CPU_ISA=...`` (or ``DNNL_MAX_CPU_ISA``) when set, else ``""``."""
    cpu_dtypes: tuple[str, ...]
    """One line per dtype of the portable mode on the CPU: ``"bfloat16: no: ..."`` with why."""
    cpu_attention: tuple[str, ...]
    """Per dtype, which attention the portable mode runs on the CPU: the library's AVX-512 or
    AVX512-BF16 kernel, or LibTorch's (with why: what the kernel would need, or where LibTorch's
    is the faster, e.g. bfloat16 on AMX-BF16 tiles)."""
    cpu_gemm: str
    """Which library runs the portable mode's float32 GEMMs on this CPU and why (``"float32
    GEMMs: MKL (...)"``); ``SAPIENS_SEG_CPU_GEMM=mkl|onednn`` overrides it."""
    wheel_cubic_path: str
    """The opencv-python wheel's ``INTER_CUBIC`` code path on this CPU (``"ipp-k0-icx"``, ...,
    ``"opencv"``): whose bytes the Sapiens2 resize reproduces here."""
    card_dirs: tuple[str, ...]


def list_cards() -> list[Card]:
    """Every model card visible now (bundled, plus the folders in ``SAPIENS_SEG_CARDS``), sorted
    by id.

    Example::

        for card in sapiens_seg.list_cards():
            print(card.id, card.license, card.sha256 or "NOT PINNED")
    """
    return [_card(d) for d in _core.list_cards()]


def find_card(model_id: str) -> Card:
    """The card of ``model_id``, which may end in ``@revision`` (the card's revision must start
    with it), as the library resolves ids; :class:`WeightsNotFoundError` naming the known ids
    otherwise."""
    return _card(_core.find_card(model_id))


def _card(d: dict) -> Card:
    d["input_size"] = (d.pop("input_height"), d.pop("input_width"))
    d["classes"] = tuple(d["classes"])
    d["palette"] = tuple(tuple(int(v) for v in rgb) for rgb in d["palette"].tolist())
    return Card(**d)


def forked_child() -> bool:
    """Whether this process was forked (``os.fork``, multiprocessing's ``"fork"``) after the
    library was loaded. Such a child runs the library on one CPU thread: GNU OpenMP's worker
    threads, which LibTorch's CPU operators use, exist in the parent only, and a parallel region
    in the child would wait for them for ever (plain torch hangs there). The library sets the
    child's thread count to 1 at its first call. Workers that need every core: use the
    ``"spawn"`` or ``"forkserver"`` start method. CUDA cannot be used after a fork."""
    return bool(_core.forked_child())


def system_info() -> SystemInfo:
    """What ``sapiens-seg info`` prints, as a :class:`SystemInfo`.

    Example::

        print(sapiens_seg.system_info().backends)
    """
    d = _core.system_info()
    # Every list becomes a tuple, so the frozen dataclass is hashable (a list field would make
    # hash() raise).
    return SystemInfo(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
