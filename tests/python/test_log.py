"""The library's log from Python: the level, its lines in `logging`, lines logged on threads
that do not hold the GIL, and an interpreter that exits with the lines routed to Python.

The lines come from a real library call that logs each time: decoding a JPEG that libjpeg
decodes with a warning ("3 extraneous bytes before marker 0xc4"), with the GIL released. The
thread and exit cases run in a child interpreter under a timeout, so a deadlock fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from conftest import PKG_PARENT, use_built_package

use_built_package()

import cv2  # noqa: E402
import numpy as np  # noqa: E402

import sapiens_seg  # noqa: E402
from sapiens_seg import DecodeWarning, InvalidInputError, _core  # noqa: E402

WARNING_TEXT = "3 extraneous bytes before marker 0xc4"
STDERR_LINE = f"sapiens-seg warning: encoded image: libjpeg: Corrupt JPEG data: {WARNING_TEXT}"


def stray_jpeg() -> bytes:
    """A JPEG with three stray bytes before a marker: decoded, with a libjpeg warning."""
    rgb = (np.arange(48 * 64 * 3) % 251).astype(np.uint8).reshape(48, 64, 3)
    ok, enc = cv2.imencode(".jpg", rgb)
    assert ok
    b = enc.tobytes()
    at = b.index(b"\xff\xc4")
    return b[:at] + b"\x11\x22\x33" + b[at:]


def decode(data: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DecodeWarning)
        sapiens_seg.read_image(data)


@pytest.fixture(autouse=True)
def restore_log():
    level = sapiens_seg.get_log_level()
    yield
    sapiens_seg.log_to_stderr()
    sapiens_seg.set_log_level(level)


def child(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    prelude = f"import sys\nsys.path.insert(0, {str(PKG_PARENT)!r})\n"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SAPIENS_SEG_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, env=full_env, timeout=timeout)


def assert_clean_exit(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, f"rc {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    for bad in ("Fatal Python error", "terminate called", "Traceback", "Segmentation fault"):
        assert bad not in r.stderr, r.stderr


# ---- the level ----------------------------------------------------------------------------------

def test_level_names_and_logging_levels():
    for given, want in [("INFO", "info"), ("warning", "warn"), ("Quiet", "quiet"),
                        (logging.DEBUG, "debug"), (logging.INFO, "info"),
                        (logging.WARNING, "warn"), (logging.ERROR, "error"),
                        (logging.CRITICAL, "error"), (logging.CRITICAL + 1, "quiet")]:
        sapiens_seg.set_log_level(given)
        assert sapiens_seg.get_log_level() == want, given
    with pytest.raises(InvalidInputError, match="'verbose' is not one of debug, info, warn"):
        sapiens_seg.set_log_level("verbose")
    with pytest.raises(TypeError):
        sapiens_seg.set_log_level(True)


def test_the_level_follows_sapiens_seg_log_until_it_is_set():
    r = child("""
        import os, sapiens_seg
        print(sapiens_seg.get_log_level())
        os.environ["SAPIENS_SEG_LOG"] = "debug"      # read again at each line: seen at once
        print(sapiens_seg.get_log_level())
        sapiens_seg.set_log_level("warn")           # from now on the environment is not read
        os.environ["SAPIENS_SEG_LOG"] = "quiet"
        print(sapiens_seg.get_log_level())
    """, env={"SAPIENS_SEG_LOG": "error"})
    assert_clean_exit(r)
    assert r.stdout.split() == ["error", "debug", "warn"]


# ---- lines into logging -------------------------------------------------------------------------

def test_lines_reach_logging_and_go_back_to_stderr(caplog, capfd):
    data = stray_jpeg()
    caplog.set_level(logging.DEBUG, logger="sapiens_seg")
    assert sapiens_seg.log_to_python() is logging.getLogger("sapiens_seg")
    decode(data)
    mine = [r for r in caplog.records if r.name == "sapiens_seg"]
    assert len(mine) == 1 and mine[0].levelno == logging.WARNING
    assert WARNING_TEXT in mine[0].getMessage()
    assert "sapiens-seg warning" not in capfd.readouterr().err

    sapiens_seg.log_to_stderr()
    caplog.clear()
    decode(data)
    assert not [r for r in caplog.records if r.name == "sapiens_seg"]
    assert STDERR_LINE in capfd.readouterr().err


def test_the_library_level_filters_before_logging(caplog):
    caplog.set_level(logging.DEBUG)
    sapiens_seg.log_to_python("sapiens_seg.test", level="error")
    assert sapiens_seg.get_log_level() == "error"
    decode(stray_jpeg())
    assert not [r for r in caplog.records if r.name.startswith("sapiens_seg")]
    sapiens_seg.set_log_level(logging.INFO)
    decode(stray_jpeg())
    assert [r.name for r in caplog.records] == ["sapiens_seg.test"]


def test_a_handler_that_raises_does_not_fail_the_call(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))

    def bad(level: str, line: str) -> None:
        raise ZeroDivisionError(line)

    _core.set_log_handler(bad)
    decode(stray_jpeg())  # no exception here
    assert seen == [ZeroDivisionError]


# ---- threads and exit ---------------------------------------------------------------------------

def test_lines_from_threads_without_the_gil_arrive_without_deadlock(tmp_path):
    """Eight threads decode (the GIL released, so each line takes the GIL on its own thread)
    while the main thread decodes too and switches the routing to stderr and back, again and
    again, each switch waiting for the lines on their way. Nothing deadlocks, and every line
    arrives once, in Python or on stderr."""
    jpeg = tmp_path / "stray.jpg"
    jpeg.write_bytes(stray_jpeg())
    r = child(f"""
        import logging, threading, time, warnings
        import sapiens_seg
        from sapiens_seg import DecodeWarning
        from pathlib import Path
        warnings.simplefilter("ignore", DecodeWarning)
        data = Path({str(jpeg)!r}).read_bytes()
        count = 0
        lock = threading.Lock()

        class Count(logging.Handler):
            def emit(self, record):
                global count
                sapiens_seg.get_log_level()        # a library call from inside the handler
                time.sleep(0.0005)                 # releases the GIL, as a handler's I/O does
                with lock:
                    count += 1

        logger = logging.getLogger("sapiens_seg")
        logger.addHandler(Count())
        logger.propagate = False
        sapiens_seg.log_to_python()

        def work():
            for _ in range(40):
                sapiens_seg.read_image(data)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for i in range(40):
            sapiens_seg.read_image(data)
            # Each switch changes the library's callback with the GIL held, while the workers'
            # lines wait for the GIL inside the library's log.
            for _ in range(5):
                sapiens_seg.log_to_stderr()
                sapiens_seg.log_to_python()
        for t in threads:
            t.join()
        print("python", count)
    """)
    assert_clean_exit(r)
    in_python = int(r.stdout.split("python", 1)[1])
    on_stderr = r.stderr.count(STDERR_LINE)
    assert in_python + on_stderr == 9 * 40, (in_python, on_stderr)
    assert in_python > 0


def test_exit_with_lines_routed_to_python(tmp_path):
    """At exit: lines logged by threads that finish during shutdown reach Python; a line logged
    after the routing is closed (an exit function that runs after sapiens_seg's) goes to stderr;
    so does a line logged from a destructor while the interpreter finalizes, even with the
    routing's exit function removed. Nothing deadlocks or crashes."""
    jpeg = tmp_path / "stray.jpg"
    jpeg.write_bytes(stray_jpeg())
    r = child(f"""
        import atexit, logging, threading, warnings
        warnings.simplefilter("ignore")
        from pathlib import Path
        data = Path({str(jpeg)!r}).read_bytes()

        def after_close():          # registered first, so it runs after sapiens_seg's own
            sapiens_seg.read_image(data)
            print("after-close", flush=True)

        atexit.register(after_close)
        import sapiens_seg
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING,
                            format="PY %(name)s %(message)s")
        sapiens_seg.log_to_python()

        stop = threading.Event()

        def work():
            while not stop.is_set():
                sapiens_seg.read_image(data)

        for _ in range(4):
            threading.Thread(target=work).start()
        sapiens_seg.read_image(data)
        stop.set()                   # the workers finish while the interpreter shuts down
    """)
    assert_clean_exit(r)
    assert r.stdout.count("PY sapiens_seg ") >= 1
    out_lines = r.stdout.splitlines()
    assert out_lines[-1] == "after-close", r.stdout
    # The exit function's line went to stderr, in the library's format.
    assert r.stderr.count(STDERR_LINE) == 1, r.stderr

    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "broken.json").write_bytes(b"\x00\xff not json")
    r = child("""
        import atexit, logging
        import sapiens_seg
        from sapiens_seg import _core, _log

        logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="PY %(message)s")
        sapiens_seg.log_to_python()
        atexit.unregister(_log.log_to_stderr)   # the routing stays open into finalization

        class LogsWhenCollected:
            def __init__(self):
                self.list_cards, self.write = _core.list_cards, sys.__stderr__.write

            def __del__(self):
                try:
                    # Logs "skipping a broken model card" (the first scan of the folder), then
                    # fails to import numpy for its answer.
                    self.list_cards()
                except ImportError:
                    pass
                self.write("collected\\n")

        keep = LogsWhenCollected()   # a module global: collected while the interpreter finalizes
    """, env={"SAPIENS_SEG_CARDS": str(cards)})
    assert_clean_exit(r)
    assert "collected" in r.stderr
    assert "sapiens-seg warning: skipping a broken model card" in r.stderr, r.stderr
    assert "PY" not in r.stdout
