"""The Ray driver's local writes (python/sapiens_seg/ray/_storage.py) follow the CLI's rule: a
file appears under its name only when complete and flushed, a failed write (a file size limit,
a full disk) raises and leaves nothing, and the temporary files of an actor killed mid-write
are removed by the next write into the folder once that process is gone.

The module is loaded by its path, so these checks need pyarrow but not Ray.

    SAPIENS_SEG_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/python/test_cli_ray_storage.py
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

pafs = pytest.importorskip("pyarrow.fs", reason="pyarrow (the Ray driver's file systems)")
SOURCE = REPO / "python" / "sapiens_seg" / "ray" / "_storage.py"


def storage():
    spec = importlib.util.spec_from_file_location("ray_storage_under_test", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_write_past_the_file_size_limit_raises_and_leaves_nothing(tmp_path):
    script = textwrap.dedent(f"""
        import errno, importlib.util, resource, sys
        spec = importlib.util.spec_from_file_location("s", {str(SOURCE)!r})
        s = importlib.util.module_from_spec(spec); spec.loader.exec_module(s)
        import pyarrow.fs as pafs
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            s._write_file(pafs.LocalFileSystem(), {str(tmp_path / "big_seg.png")!r}, b"x" * 10000)
        except OSError as e:
            sys.exit(0 if e.errno == errno.EFBIG else 2)
        sys.exit(1)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)  # raised EFBIG, not killed by SIGXFSZ
    assert list(tmp_path.iterdir()) == []


def test_a_complete_write_and_the_temporary_files_of_dead_writers(tmp_path):
    s = storage()
    fs = pafs.LocalFileSystem()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"a_seg.png.tmp-{s._HOST}-{dead}-0123abcd"
    live = tmp_path / f"b_seg.png.tmp-{s._HOST}-{os.getppid()}-0123abcd"
    other_host = tmp_path / f"c_seg.png.tmp-elsewhere-{dead}-0123abcd"
    mine = tmp_path / "notes.tmp-1"
    for f in (stale, live, other_host, mine):
        f.write_bytes(b"partial")
    s._write_file(fs, str(tmp_path / "x_seg.png"), b"\x89PNG whole")
    assert (tmp_path / "x_seg.png").read_bytes() == b"\x89PNG whole"
    assert not stale.exists()  # its writer is gone
    assert live.exists() and other_host.exists() and mine.exists()  # cannot tell / not ours
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["x_seg.png", live.name, other_host.name, mine.name])
