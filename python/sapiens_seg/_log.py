"""The library's log from Python: its level, and its lines in :mod:`logging`.

The native library writes its log lines (a download that retries, a broken model card, a
decoder's warning, ``info`` lines about what was loaded) to stderr as ``sapiens-seg warning:
...``, at ``warn`` and above unless ``SAPIENS_SEG_LOG`` says otherwise. From Python::

    import logging, sapiens_seg

    sapiens_seg.set_log_level("info")       # or logging.INFO; "quiet" drops every line
    sapiens_seg.log_to_python()             # lines go to logging.getLogger("sapiens_seg")
    sapiens_seg.log_to_stderr()             # back to stderr

The library drops lines below its own level before they reach Python, so a logger set to DEBUG
sees debug lines only after ``set_log_level("debug")`` (or ``log_to_python(level=...)``).

Lines logged on other threads (a load or download runs without the GIL) reach the logger on
that thread, which takes the GIL for it. At interpreter exit the routing is closed by an
:mod:`atexit` function, which waits for lines already on their way to Python; lines logged
after it go to stderr.
"""

from __future__ import annotations

import atexit
import logging
from typing import Optional, Union

from . import _core

__all__ = ["LOGGER_NAME", "get_log_level", "log_to_python", "log_to_stderr", "set_log_level"]

LOGGER_NAME = "sapiens_seg"
"""The logger :func:`log_to_python` uses by default."""

_TO_LOGGING = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}

LevelArg = Union[str, int]


def _level_name(level: LevelArg) -> str:
    if isinstance(level, bool) or not isinstance(level, (str, int)):
        raise TypeError("level: expected 'debug', 'info', 'warn', 'error', 'quiet' or a logging "
                        f"level such as logging.INFO, got {type(level).__name__}")
    if isinstance(level, int):
        if level <= logging.DEBUG:
            return "debug"
        if level <= logging.INFO:
            return "info"
        if level <= logging.WARNING:
            return "warn"
        if level <= logging.CRITICAL:
            return "error"
        return "quiet"
    name = level.strip().lower()
    return "warn" if name == "warning" else name


def set_log_level(level: LevelArg) -> None:
    """Sets the library's log level: ``"debug"``, ``"info"``, ``"warn"`` (or ``"warning"``),
    ``"error"`` or ``"quiet"``, in any case, or a :mod:`logging` level (``logging.INFO``; above
    ``logging.CRITICAL``: quiet). It overrides ``SAPIENS_SEG_LOG`` from then on, for the whole
    process (C++ callers and the CLI share it). :class:`~sapiens_seg.InvalidInputError` (a
    ``ValueError``) for another name.
    """
    _core.set_log_level(_level_name(level))


def get_log_level() -> str:
    """The library's level in force now: what :func:`set_log_level` set, else
    ``SAPIENS_SEG_LOG`` as it is now, else ``"warn"``."""
    return _core.log_level()


def log_to_python(logger: Union[logging.Logger, str, None] = None, *,
                  level: Optional[LevelArg] = None) -> logging.Logger:
    """Sends the library's log lines to ``logger`` (a :class:`logging.Logger`, a logger name,
    or None for ``logging.getLogger("sapiens_seg")``) at the matching :mod:`logging` level
    (``warn`` becomes ``WARNING``), instead of stderr; ``level`` also calls
    :func:`set_log_level`. Returns the logger.

    Example::

        logging.basicConfig(level=logging.INFO)
        sapiens_seg.log_to_python(level="info")
        model = sapiens_seg.load("sapiens2-seg-0.4b")   # "loaded sapiens2-seg-0.4b (...)" logged

    An exception raised by a logging handler is reported through :func:`sys.unraisablehook`
    and does not fail the library call that logged.
    """
    if logger is None or isinstance(logger, str):
        logger = logging.getLogger(LOGGER_NAME if logger is None else logger)
    if not isinstance(logger, logging.Logger):
        raise TypeError(f"logger: expected a logging.Logger, a name or None, got "
                        f"{type(logger).__name__}")
    if level is not None:
        set_log_level(level)
    target = logger

    def handler(name: str, line: str) -> None:
        target.log(_TO_LOGGING.get(name, logging.WARNING), line)

    _core.set_log_handler(handler)
    return logger


def log_to_stderr() -> None:
    """Sends the library's log lines to stderr again (the default), once the lines already on
    their way to Python have arrived."""
    _core.set_log_handler(None)


# Before the interpreter finalizes: no thread may enter Python after that.
atexit.register(log_to_stderr)
