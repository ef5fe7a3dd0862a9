"""A process forked from one that imported sapiens_seg (``os.fork``, multiprocessing's
``"fork"`` start method, a pre-forking server) can call the library, on one CPU thread.

Why: LibTorch's CPU operators, oneDNN and MKL run on GNU OpenMP's thread pool (libgomp). Its
worker threads exist in the parent only; a forked child that starts a parallel region with more
than one thread waits at libgomp's barrier for threads that are not there, for ever (plain torch
does the same). One thread needs no team, so every child is given one: ``at::set_num_threads(1)``
of the LibTorch the extension runs on, which sets OpenMP, MKL and LibTorch's own count for every
later thread of the child, as PyTorch's DataLoader does in its forked workers.

Every child, not only those of a parent that ran the library: whether libgomp's pool exists
cannot be asked, and counting threads misleads (OpenBLAS stops its own at each fork). A child of
a parent that never loaded a model or called the library may ask for threads again
(``load(..., threads=4)``); in a child of one that did, that waits at the barrier. Workers that
need every core: the ``"spawn"`` or ``"forkserver"`` start method. CUDA cannot be used after
fork in any case (a CUDA limit). ``single_threaded`` says whether this process is such a child.
"""

from __future__ import annotations

import ctypes
import os

single_threaded = False  # this process is a child forked after import (see the docstring)
_set_num_threads = None  # at::set_num_threads(int), resolved at import


def _find_set_num_threads():
    """The C++ at::set_num_threads of the libtorch_cpu this process has loaded (looked up
    through the already-loaded library: the extension loads it privately)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "libtorch_cpu" in line}
        for path in paths:
            fn = ctypes.CDLL(path)["_ZN2at15set_num_threadsEi"]  # at::set_num_threads(int)
            fn.argtypes = [ctypes.c_int]
            fn.restype = None
            return fn
    except (OSError, AttributeError, KeyError):
        pass
    return None


def _after_fork_in_child() -> None:
    global single_threaded
    _set_num_threads(1)
    single_threaded = True


def install() -> None:
    """Registers the fork handler (once, at import of sapiens_seg)."""
    global _set_num_threads
    if _set_num_threads is not None or not hasattr(os, "register_at_fork"):
        return
    # Resolved now, not in the child: a child of a threaded parent must not take the dynamic
    # loader's lock, which another thread may have held at the fork.
    _set_num_threads = _find_set_num_threads()
    if _set_num_threads is not None:
        os.register_at_fork(after_in_child=_after_fork_in_child)
