"""Downloads from Python: segmentation.download() and load() with progress= (a tqdm bar on a
terminal or in a notebook, none on a pipe, a callable's byte counts), Ctrl-C (KeyboardInterrupt
that stops the transfer and keeps the .part) and the resume after it.

Never touches the internet: HF_ENDPOINT points at tests/python/hub_server.py on 127.0.0.1.
The notebook is simulated (no Jupyter here): a subprocess registers stand-ins for the modules a
Jupyter kernel imports (``ipykernel.zmqshell`` and ``IPython.get_ipython()`` returning a
``ZMQInteractiveShell``), which is what tqdm.auto and sapiens_seg look at, and replaces stderr
with a stream that is not a terminal, as a kernel's is. ipywidgets is blocked, so tqdm.auto takes
its notebook branch and then draws its text bar into that stream (its documented fallback).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from conftest import REPO, FIXTURES, PKG_PARENT, use_built_package

use_built_package()

from hub_server import HubServer  # noqa: E402
from ptyrun import run_with_tty_stderr  # noqa: E402

import sapiens_seg  # noqa: E402
from sapiens_seg import DownloadError, segmentation  # noqa: E402
from sapiens_seg import _progress  # noqa: E402

FILE = "tiny_b_torchscript.pt2"
ID = "pydl-tiny-b"


@pytest.fixture(scope="module")
def payload():
    return (FIXTURES / FILE).read_bytes()


@pytest.fixture()
def hub(payload):
    server = HubServer({FILE: payload})
    yield server
    server.close()


@pytest.fixture()
def env(tmp_path, payload):
    """The environment of a fresh machine: empty caches, one card pointing at the test hub."""
    card = json.loads((FIXTURES / "cards" / "tiny_b.json").read_text())
    card.update(id=ID, repo="test/tiny-b", revision="r1", path_in_repo=FILE, size=len(payload),
                sha256=hashlib.sha256(payload).hexdigest())
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / f"{ID}.json").write_text(json.dumps(card))
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SAPIENS_SEG_", "HF_", "TQDM_"))}
    base.update(SAPIENS_SEG_HOME=str(tmp_path / "home"), SAPIENS_SEG_CARDS=str(tmp_path / "cards"),
                HF_HUB_CACHE=str(tmp_path / "hf"), SAPIENS_SEG_RETRY_BASE_MS="50",
                PYTHONPATH=str(PKG_PARENT))
    return base


@pytest.fixture()
def here(env, monkeypatch):
    """`env` applied to this process, for in-process calls."""
    for k in list(os.environ):
        if k.startswith(("SAPIENS_SEG_", "HF_", "TQDM_")):
            monkeypatch.delenv(k)
    for k, v in env.items():
        if k.startswith(("SAPIENS_SEG_", "HF_")):
            monkeypatch.setenv(k, v)
    return env


def target(env) -> Path:
    return Path(env["SAPIENS_SEG_HOME"]) / "weights" / FILE


def part(env) -> Path:
    return Path(str(target(env)) + ".part")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


# ---- a callable --------------------------------------------------------------------------

def test_a_callable_sees_monotonic_byte_counts(here, hub, payload, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint("slow"))
    seen = []
    path = segmentation.download(ID, progress=seen.append)
    assert path == str(target(here)) and target(here).read_bytes() == payload
    assert len(seen) >= 3, seen  # the slow hub takes over a second: several reports
    assert all(isinstance(p, segmentation.DownloadProgress) for p in seen)
    assert {p.file for p in seen} == {FILE}
    done = [p.done for p in seen]
    assert done == sorted(done) and done[-1] == len(payload)
    assert seen[-1].total == len(payload) and all(p.total in (None, len(payload)) for p in seen)
    assert any(p.bytes_per_second > 0 for p in seen)
    # Present now: nothing to report, nothing fetched again.
    again = []
    assert sapiens_seg.download(ID, progress=again.append) == path
    assert again == [] and len(hub.gets(FILE)) == 1


def test_load_downloads_with_the_same_reports(here, hub, payload, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint("ok"))
    seen = []
    model = segmentation.load(ID, mode="portable", device="cpu", progress=seen.append)
    assert model.info.path == str(target(here))
    assert seen and seen[-1].done == len(payload)
    assert model(str(REPO / "examples" / "astronaut.jpg")).labels.shape == (512, 512)


def test_false_cancels_and_the_next_call_resumes(here, hub, payload, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint("slow"))
    with pytest.raises(DownloadError, match="cancelled"):
        segmentation.download(ID, progress=lambda p: p.done < 300_000)
    kept = part(here).stat().st_size
    assert 300_000 <= kept < len(payload) and not target(here).exists()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint("ok"))
    seen = []
    segmentation.download(ID, progress=seen.append)
    resumed = hub.gets(FILE)[-1]
    assert resumed.range == f"bytes={kept}-" and resumed.sent == len(payload) - kept
    assert seen[0].done >= kept  # a resumed download counts what is already on disk
    assert target(here).read_bytes() == payload


def test_an_exception_in_the_callable_cancels_and_propagates(here, hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint("slow"))

    def boom(p):
        if p.done > 200_000:
            raise ZeroDivisionError("from the progress callable")

    with pytest.raises(ZeroDivisionError, match="from the progress callable"):
        segmentation.load(ID, progress=boom)
    assert part(here).stat().st_size > 0 and not target(here).exists()


def test_the_argument_is_checked(here):
    with pytest.raises(TypeError, match="progress"):
        segmentation.download(ID, progress="yes")
    with pytest.raises(TypeError, match="progress"):
        segmentation.load(ID, progress=1)
    with pytest.raises(TypeError, match="card id"):
        segmentation.download(Path(ID))
    with pytest.raises(ValueError, match="empty"):
        segmentation.download("")


def test_without_tqdm_a_bar_request_warns_and_downloads(here, hub, payload, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint("ok"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import fails as if not installed
    with pytest.warns(RuntimeWarning, match="tqdm is not installed"):
        segmentation.download(ID, progress=True)
    assert target(here).read_bytes() == payload


# ---- the default bar: terminal, pipe, notebook -------------------------------------------

DOWNLOAD = f"""
    import sys
    from sapiens_seg import segmentation
    print(segmentation.download({ID!r}, progress=eval(sys.argv[1])))
"""


@pytest.mark.parametrize("size", [(100, 30), None])  # a sized terminal, and a bare pty
def test_the_bar_is_drawn_on_a_terminal(env, hub, size):
    code, text = run_with_tty_stderr([*python(DOWNLOAD), "None"],
                                     dict(env, HF_ENDPOINT=hub.endpoint("slow")), size=size)
    assert code == 0, text
    # tqdm's bar: name, percentage, bytes with binary prefixes, rate, redrawn with \r across
    # the terminal's width (80 columns where the terminal reports no size).
    assert f"{FILE}: 100%|" in text and "4.55M/4.55M" in text and "B/s]" in text, text
    assert text.count("\r") >= 3  # redrawn while the slow hub sends
    last = text.rstrip().split("\r")[-1]
    assert len(last) in (columns := (size or (80, 24))[0], columns - 1), last


def test_no_bar_on_a_pipe_or_when_turned_off(env, hub):
    e = dict(env, HF_ENDPOINT=hub.endpoint("ok"))

    def on_pipe(progress, **extra):
        target(env).unlink(missing_ok=True)
        r = subprocess.run([*python(DOWNLOAD), progress], env=dict(e, **extra),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stderr

    def on_tty(progress, **extra):
        target(env).unlink(missing_ok=True)
        code, text = run_with_tty_stderr([*python(DOWNLOAD), progress], dict(e, **extra),
                                         size=(100, 30))
        assert code == 0, text
        return text

    assert "100%" not in on_pipe("None") and "B/s" not in on_pipe("False")
    assert "100%" not in on_tty("False")
    # HF_HUB_DISABLE_PROGRESS_BARS turns the default off as for the Hugging Face tools ...
    assert "100%" not in on_tty("None", HF_HUB_DISABLE_PROGRESS_BARS="1")
    # ... and progress=True draws one even on a pipe.
    assert f"{FILE}: 100%|" in on_pipe("True")


NOTEBOOK = f"""
    import io, sys, types, warnings

    class ZMQInteractiveShell:       # what get_ipython() returns in a Jupyter kernel
        config = {{"IPKernelApp": {{}}}}

    kernel = {{kernel}}
    if kernel:
        ipython = types.ModuleType("IPython")
        ipython.get_ipython = lambda: ZMQInteractiveShell()
        sys.modules["IPython"] = ipython
        sys.modules["ipykernel"] = types.ModuleType("ipykernel")
        sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")
    sys.modules["ipywidgets"] = None   # not installed: tqdm's notebook bar falls back to text

    class OutStream(io.StringIO):      # a kernel's sys.stderr: not a terminal
        def isatty(self):
            return False

    real_stderr, sys.stderr = sys.stderr, OutStream()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from sapiens_seg import segmentation
        path = segmentation.download({ID!r})
    shown, sys.stderr = sys.stderr.getvalue(), real_stderr
    print(repr(shown))
    print(repr([str(w.message) for w in caught]))
"""


@pytest.mark.parametrize("kernel", [True, False])
def test_the_bar_is_drawn_in_a_notebook(env, hub, kernel):
    e = dict(env, HF_ENDPOINT=hub.endpoint("ok"))
    r = subprocess.run(python(NOTEBOOK.replace("{kernel}", str(kernel))), env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    shown_line, warnings_line = r.stdout.splitlines()[-2:]
    shown, messages = eval(shown_line), eval(warnings_line)
    if kernel:
        # tqdm.auto took its notebook branch (it warns that the widget library is missing) and
        # the bar reached the kernel's stream.
        assert any("IProgress not found" in m for m in messages), messages
        assert f"{FILE}: 100%|" in shown, shown
    else:
        assert shown == "" and not any("IProgress" in m for m in messages), (shown, messages)


def test_wants_bar_rules(monkeypatch):
    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.delitem(sys.modules, "ipykernel.zmqshell", raising=False)
    assert _progress.wants_bar(Stream(True)) and not _progress.wants_bar(Stream(False))
    assert not _progress.wants_bar(object())  # no isatty at all
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", object())
    assert _progress.wants_bar(Stream(False))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    assert not _progress.wants_bar(Stream(True))


# ---- Ctrl-C ------------------------------------------------------------------------------

INTERRUPTED = f"""
    import sys, time
    from sapiens_seg import segmentation
    try:
        if sys.argv[1] == "download":
            segmentation.download({ID!r})
        else:
            segmentation.load({ID!r}, device="cpu")
    except KeyboardInterrupt:
        print("KeyboardInterrupt", time.monotonic(), flush=True)
        sys.exit(130)
    print("not interrupted", flush=True)
"""


@pytest.mark.parametrize("call", ["download", "load"])
def test_ctrl_c_raises_promptly_and_the_resume_sends_each_byte_once(env, hub, payload, call):
    hub.slow_chunk, hub.slow_delay = 16 * 1024, 0.05  # ~320 kB/s: 15 s for the whole file
    p = subprocess.Popen([*python(INTERRUPTED), call], env=dict(env, HF_ENDPOINT=hub.endpoint("slow")),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (part(env).exists() and part(env).stat().st_size >= 200_000):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.01)
    sent_at = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "KeyboardInterrupt" in out, (out, err)
    # CLOCK_MONOTONIC is system-wide: the child's handler ran this soon after the signal.
    latency = float(out.split()[1]) - sent_at
    print(f"KeyboardInterrupt {latency:.2f} s after SIGINT")
    assert latency < 3.0, f"KeyboardInterrupt came {latency:.2f} s after SIGINT"
    kept = part(env).stat().st_size
    assert 200_000 <= kept < len(payload) and not target(env).exists()
    assert part(env).read_bytes() == payload[:kept]
    (first,) = hub.gets(FILE)
    assert first.range is None
    # The transfer stopped: the server sent only what was in flight when the signal came.
    assert first.sent < len(payload)

    r = subprocess.run(python(DOWNLOAD) + ["False"], env=dict(env, HF_ENDPOINT=hub.endpoint("ok")),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    second = hub.gets(FILE)[-1]
    # The resume asks for the bytes after the .part and gets exactly those: no byte of the file
    # is written twice, and none is fetched again that was already on disk.
    assert second.range == f"bytes={kept}-" and second.status == 206
    assert second.sent == len(payload) - kept
    assert target(env).read_bytes() == payload and not part(env).exists()
