"""Exceptions raised by sapiens_seg.

Every failure inside the C++ library is a ``sapiens_seg::Error`` with an error code; the binding
raises the class of that code below, with the library's message unchanged. All of them derive
from :class:`SapiensSegError`, whose ``code`` attribute is the :class:`ErrorCode`::

    from sapiens_seg import segmentation, SapiensSegError, WeightsNotFoundError

    try:
        model = segmentation.load("sapiens-seg-0.3b-goliath", accept_noncommercial=True)
    except WeightsNotFoundError as e:   # also a FileNotFoundError
        print(e)                        # names the file, its SHA-256, its URL and the folder
    except SapiensSegError as e:
        print(e.code.name, e)

Some classes also derive from the built-in exception that fits, so generic handlers work:
``WeightsNotFoundError`` is a ``FileNotFoundError``, ``InvalidInputError`` a ``ValueError`` and
``SapiensIOError`` an ``OSError`` and ``OutOfMemoryError`` a ``MemoryError``.

Arguments that are wrong on the Python side (an unknown ``mode``, a float array, ...) raise the
built-in ``ValueError`` or ``TypeError`` naming the argument; a wrongly shaped image raises
``InvalidInputError`` (a ``ValueError``).
"""

from __future__ import annotations

import enum

__all__ = [
    "ErrorCode",
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
    "DecodeWarning",
]


class ErrorCode(enum.IntEnum):
    """The library's error codes (``sapiens_seg::ErrorCode``; the CLI exits with 10 + code)."""

    NOT_FOUND = 1
    """Weights, card or input file not found."""
    CHECKSUM_MISMATCH = 2
    """The SHA-256 of a weights file differs from its card."""
    DOWNLOAD_FAILED = 3
    """Network or server failure while fetching weights."""
    OFFLINE = 4
    """The file is needed but offline mode forbids fetching it."""
    LICENSE_NOT_ACCEPTED = 5
    """Non-commercial weights without explicit acceptance."""
    BACKEND_UNAVAILABLE = 6
    """The requested mode, device or dtype cannot run here."""
    INVALID_INPUT = 7
    """Bad image, bad argument, wrong size."""
    FORMAT_ERROR = 8
    """Malformed checkpoint or card."""
    IO = 9
    """Cannot read or write a file (permissions, disk full)."""
    INTERNAL = 10
    """A bug: please report it."""
    OUT_OF_MEMORY = 11
    """An allocation failed: host memory, CUDA memory, or a thread that cannot start."""

    @property
    def label(self) -> str:
        """The code as the library's messages, the CLI and ``summary.json`` spell it
        (``"not_found"``, ``"io_error"``, ...)."""
        return _native_codes()[int(self)][0]

    @property
    def exit_status(self) -> int:
        """The exit status of ``sapiens-seg`` (and ``python -m sapiens_seg.ray``) for a failure
        of this code."""
        return _native_codes()[int(self)][1]

    @classmethod
    def from_label(cls, label: str) -> ErrorCode:
        """The code that :attr:`label` spells ``label``; ``ValueError`` for an unknown one."""
        for value, (name, _) in _native_codes().items():
            if name == label:
                return cls(value)
        raise ValueError(f"not an error code: {label!r}")


def _native_codes() -> dict[int, tuple[str, int]]:
    """value -> (label, exit status), from the library's table (sapiens_seg/names.hpp)."""
    global _CODES
    if _CODES is None:
        from . import _core

        _CODES = {value: (label, status) for value, label, status in _core.error_codes()}
    return _CODES


_CODES: dict[int, tuple[str, int]] | None = None


class SapiensSegError(Exception):
    """Base class of every error the library raises; ``code`` says which kind it is."""

    code: ErrorCode = ErrorCode.INTERNAL


class WeightsNotFoundError(SapiensSegError, FileNotFoundError):
    """Weights, a card or an input file were not found (``ErrorCode.NOT_FOUND``).

    For weights the message says which file to fetch, its SHA-256, its URL and where to put it.
    """

    code = ErrorCode.NOT_FOUND


class ChecksumError(SapiensSegError):
    """A weights file's SHA-256 differs from its card (``ErrorCode.CHECKSUM_MISMATCH``)."""

    code = ErrorCode.CHECKSUM_MISMATCH


class DownloadError(SapiensSegError):
    """Fetching weights failed (``ErrorCode.DOWNLOAD_FAILED``)."""

    code = ErrorCode.DOWNLOAD_FAILED


class OfflineError(SapiensSegError):
    """Weights are missing and offline mode forbids fetching them (``ErrorCode.OFFLINE``)."""

    code = ErrorCode.OFFLINE


class LicenseNotAcceptedError(SapiensSegError):
    """Non-commercial weights loaded without ``accept_noncommercial=True``
    (``ErrorCode.LICENSE_NOT_ACCEPTED``)."""

    code = ErrorCode.LICENSE_NOT_ACCEPTED


class BackendUnavailableError(SapiensSegError):
    """The requested mode, device or dtype cannot run here (``ErrorCode.BACKEND_UNAVAILABLE``).

    Nothing falls back silently: ask for ``mode="auto"`` to let the library choose.
    """

    code = ErrorCode.BACKEND_UNAVAILABLE


class InvalidInputError(SapiensSegError, ValueError):
    """An image that cannot be segmented: undecodable, truncated, too small (both sides must be
    at least 32 pixels), too large, or of the wrong shape (``ErrorCode.INVALID_INPUT``)."""

    code = ErrorCode.INVALID_INPUT


class CheckpointFormatError(SapiensSegError):
    """A malformed checkpoint or card (``ErrorCode.FORMAT_ERROR``)."""

    code = ErrorCode.FORMAT_ERROR


class SapiensIOError(SapiensSegError, OSError):
    """A file could not be read or written (``ErrorCode.IO``)."""

    code = ErrorCode.IO


class InternalError(SapiensSegError):
    """A bug in sapiens-seg (``ErrorCode.INTERNAL``): please report it with the message."""

    code = ErrorCode.INTERNAL


class OutOfMemoryError(SapiensSegError, MemoryError):
    """An allocation failed (``ErrorCode.OUT_OF_MEMORY``): host or CUDA memory for a batch, the
    full-size logits of a large image, a decoded image. The message says what was being
    allocated; a smaller ``batch_size`` or ``logits=False`` needs less. The model stays usable.
    """

    code = ErrorCode.OUT_OF_MEMORY


class DecodeWarning(UserWarning):
    """The image decoder warned about a file that it still decoded, as cv2.imread decodes it
    (libjpeg's "Corrupt JPEG data: ...", libpng's): issued by ``read_image``; a model call lists
    them in ``Result.warnings`` instead."""


_BY_CODE: dict[int, type[SapiensSegError]] = {
    cls.code.value: cls
    for cls in (
        WeightsNotFoundError,
        ChecksumError,
        DownloadError,
        OfflineError,
        LicenseNotAcceptedError,
        BackendUnavailableError,
        InvalidInputError,
        CheckpointFormatError,
        SapiensIOError,
        InternalError,
        OutOfMemoryError,
    )
}


def _class_for_code(code: int) -> type[SapiensSegError]:
    """The class the native layer raises for a library error code (InternalError if unknown)."""
    return _BY_CODE.get(code, InternalError)
