"""Download progress for :func:`sapiens_seg.segmentation.load` and ``download``.

The native layer calls a reporter ``(file, done, total, bytes_per_second) -> bool`` a few times
a second while a checkpoint is transferred (with the GIL held), after it has run Python's signal
handlers: Ctrl-C raises ``KeyboardInterrupt`` there, which cancels the transfer. Returning False
cancels too. The partial ``.part`` file is kept either way, so the next call resumes it.

``progress=None`` (the default) draws a bar where a person is looking: stderr is a terminal, or
the code runs in a Jupyter kernel (detected as ``tqdm.auto`` detects it: ``ipykernel.zmqshell``
imported). ``HF_HUB_DISABLE_PROGRESS_BARS=1`` turns that default off, as it does for the Hugging
Face tools; ``TQDM_DISABLE=1`` hides every tqdm bar.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Callable, NamedTuple, Optional, Union

__all__ = ["DownloadProgress", "ProgressArg", "make_reporter", "wants_bar"]


class DownloadProgress(NamedTuple):
    """What a ``progress=`` callable is given while a checkpoint downloads.

    ``done`` never decreases during one transfer (it starts at the bytes already in the
    ``.part`` file when a download resumes); ``total`` is None while the size is unknown.
    """

    file: str
    """The checkpoint's file name."""
    done: int
    """Bytes on disk, resumed bytes included."""
    total: Optional[int]
    """The file's size in bytes, or None when not known yet."""
    bytes_per_second: float
    """Transfer rate of this download so far (0 when not known)."""


ProgressArg = Union[None, bool, Callable[[DownloadProgress], Any]]

_TRUTHY = {"1", "ON", "YES", "TRUE"}


def _in_notebook() -> bool:
    # The test tqdm.autonotebook uses: an IPython kernel (Jupyter, VS Code, Colab) has imported
    # ipykernel's ZMQ shell; a terminal IPython has not (and has a terminal anyway).
    return "ipykernel.zmqshell" in sys.modules


def wants_bar(stream: Any = None) -> bool:
    """Whether ``progress=None`` draws a bar: a terminal on stderr, or a notebook."""
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().upper() in _TRUTHY:
        return False
    if _in_notebook():
        return True
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _width() -> dict:
    """tqdm's size arguments: follow the terminal's size, except on a terminal that reports
    none (a pseudo-terminal without a size, as `docker exec -t` can give), where tqdm would draw
    nothing at all: 80 x 24 there."""
    stream = sys.stderr
    try:
        if stream.isatty() and os.get_terminal_size(stream.fileno()).columns == 0:
            return {"ncols": 80, "nrows": 24}
    except (AttributeError, ValueError, OSError):
        pass
    return {"dynamic_ncols": True}


class _Bar:
    """A tqdm bar (``tqdm.auto``: a widget in notebooks with ipywidgets, text elsewhere), made at
    the first byte count so that it starts at the resumed size."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._failed = False

    def __call__(self, file: str, done: int, total: int, rate: float) -> bool:
        if self._failed or (done == 0 and total == 0):
            return True  # waiting for another process's download: nothing to draw yet
        if self._bar is None:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self._failed = True
                warnings.warn("sapiens_seg: tqdm is not installed, so downloads show no progress "
                              "bar (pip install tqdm)", RuntimeWarning, stacklevel=2)
                return True
            self._bar = tqdm(total=total or None, initial=done, desc=file, unit="B",
                             unit_scale=True, unit_divisor=1024, **_width())
        bar = self._bar
        if total and bar.total != total:
            bar.total = total
        if done >= bar.n:
            bar.update(done - bar.n)
        else:  # the server ignored the range request: the transfer started over
            bar.reset(total=total or None)
            bar.update(done)
        return True

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class _Callback:
    """A user's callable, given :class:`DownloadProgress` tuples; ``False`` cancels."""

    def __init__(self, fn: Callable[[DownloadProgress], Any]) -> None:
        self._fn = fn

    def __call__(self, file: str, done: int, total: int, rate: float) -> bool:
        return self._fn(DownloadProgress(file, done, total or None, rate)) is not False

    def close(self) -> None:
        pass


def make_reporter(progress: ProgressArg) -> Optional[Union[_Bar, _Callback]]:
    """The native layer's reporter for a ``progress=`` argument, or None for no reports (the
    native layer still cancels on Ctrl-C then)."""
    if progress is None:
        return _Bar() if wants_bar() else None
    if isinstance(progress, bool):
        return _Bar() if progress else None
    if callable(progress):
        return _Callback(progress)
    raise TypeError("progress: expected None, True, False or a callable taking a "
                    f"DownloadProgress, got {type(progress).__name__}")
