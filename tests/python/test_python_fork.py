"""A process forked after the library ran (os.fork, multiprocessing's "fork" start method, a
pre-forking server) calls the model and gets the parent's results, on one CPU thread; before,
it waited for ever at GNU OpenMP's barrier for worker threads that exist only in the parent
(the library's fork handler, src/api/fork.hpp; docs/python.md "Processes and fork"). The "spawn" start method,
the documented way to get workers with every core, works too.

Each case runs in its own interpreter under a time limit, so a hang fails the test instead of
stopping the suite.

    SAPIENS_SEG_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/python/test_python_fork.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import FIXTURES, PKG_PARENT, extension_built

TINY = FIXTURES / "tiny_a_torchscript.pt2"

pytestmark = [
    pytest.mark.skipif(not extension_built(), reason="the Python extension is not built"),
    pytest.mark.skipif(not TINY.exists(), reason=f"no fixtures in {FIXTURES}"),
]

PRELUDE = f"""
import os, sys, numpy as np
sys.path.insert(0, {str(PKG_PARENT)!r})
import sapiens_seg
from sapiens_seg import segmentation
TINY = {str(TINY)!r}
IMG = (np.random.default_rng(0).random((64, 48, 3)) * 255).astype(np.uint8)
"""


def run(body: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPIENS_SEG_")}
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("threads", [None, 2], ids=["default-threads", "threads-2"])
def test_a_child_forked_after_the_model_ran_gets_the_same_labels(threads):
    r = run(f"""
        kw = {{}} if {threads!r} is None else {{"threads": {threads!r}}}
        m = segmentation.load(TINY, device="cpu", **kw)
        parent = m(IMG).labels
        pid = os.fork()
        if pid == 0:
            import signal
            signal.alarm(60)  # a hang ends the child, and fails the test below
            ok = np.array_equal(m(IMG).labels, parent) and len(m([IMG, IMG])) == 2
            os._exit(0 if ok and sapiens_seg.forked_child() else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        assert np.array_equal(m(IMG).labels, parent)  # and the parent goes on
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child 0", (r.stdout, r.stderr)


def test_a_multiprocessing_fork_pool_and_a_spawn_pool_both_work():
    r = run("""
        import multiprocessing as mp
        m = segmentation.load(TINY, device="cpu")
        parent = m(IMG).labels

        def labels(_):
            return m(IMG).labels

        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map_async(labels, range(2)).get(timeout=60)
        assert all(np.array_equal(g, parent) for g in got)
        print("fork ok")
    """)
    assert r.returncode == 0, r.stderr
    assert "fork ok" in r.stdout
    # "spawn": workers are fresh interpreters that load the model themselves (every core).
    script = PRELUDE + textwrap.dedent("""
        import multiprocessing as mp

        def labels(_):
            m = segmentation.load(TINY, device="cpu")
            return m(IMG).labels, sapiens_seg.forked_child()

        if __name__ == "__main__":
            parent = segmentation.load(TINY, device="cpu")(IMG).labels
            with mp.get_context("spawn").Pool(2) as pool:
                got = pool.map_async(labels, range(2)).get(timeout=90)
            assert all(np.array_equal(g, parent) and not single for g, single in got)
            print("spawn ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPIENS_SEG_")}
    path = FIXTURES.parent / "spawn_check.py"
    try:
        path.write_text(script)
        r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                           timeout=180, env=env)
    finally:
        path.unlink(missing_ok=True)
    assert r.returncode == 0, r.stderr
    assert "spawn ok" in r.stdout


def test_a_child_of_a_parent_that_never_ran_the_library_may_ask_for_threads_again():
    r = run("""
        pid = os.fork()
        if pid == 0:
            import signal
            signal.alarm(60)
            m = segmentation.load(TINY, device="cpu", threads=2)
            ok = sapiens_seg.forked_child() and m(IMG).labels.shape == (64, 48)
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child 0"
