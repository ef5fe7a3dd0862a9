"""Full and limited storage, concurrent runs and killed runs of `sapiens-seg segment`: an output
exists under its final name only when it is complete, a failed write is an error entry (exit 19)
that says which files were written, a file size limit (RLIMIT_FSIZE, `ulimit -f`) is an error and
not a death by SIGXFSZ, two runs into one folder cannot replace each other's files, and no
temporary file outlives a run or a resume (docs/cli-outputs.md, docs/robustness.md).

A full disk is a small tmpfs mounted here where the test may mount one (root in a sandbox or a
CI container with CAP_SYS_ADMIN); elsewhere those tests skip and say why. The file size limit
is set on the CLI's process (resource.setrlimit in preexec_fn) and works everywhere.

    SAPIENS_SEG_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/python/test_cli_storage.py
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import CLI, FIXTURES

TINY = FIXTURES / "tiny_a_torchscript.pt2"
FFMPEG = shutil.which("ffmpeg")

pytestmark = [
    pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built"),
    pytest.mark.skipif(not TINY.exists(), reason=f"no fixtures in {FIXTURES}"),
]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}


def cli(*args, timeout=240, fsize: int | None = None, **kw) -> subprocess.CompletedProcess:
    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    # subprocess restores SIGXFSZ to its default in the child (Python itself ignores it): the
    # CLI must ignore it on its own.
    return subprocess.run([str(a) for a in (CLI, *args)], capture_output=True, text=True,
                          env=clean_env(), timeout=timeout, preexec_fn=limit, **kw)


def noise_image(path: Path, h: int, w: int, seed: int) -> None:
    """Random pixels: PNG cannot compress them, so the sizes of the outputs are predictable."""
    rng = np.random.default_rng(seed)
    assert cv2.imwrite(str(path), (rng.random((h, w, 3)) * 255).astype(np.uint8))


def noise_video(path: Path, seconds: int) -> Path:
    """A 160x120 H.264 clip of random pixels at 10 frames a second (incompressible: its outputs
    are large). Skips without ffmpeg."""
    if FFMPEG is None:
        pytest.skip("ffmpeg (Debian package ffmpeg) is needed to make the video")
    subprocess.run([FFMPEG, "-v", "error", "-f", "lavfi", "-i",
                    f"nullsrc=s=160x120:r=10:d={seconds},geq=random(1)*255:128:128", "-c:v",
                    "libx264", "-pix_fmt", "yuv420p", str(path)], check=True, timeout=60)
    return path


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp" in p.name or "partial" in p.name]


def check_complete(folder: Path, shape: tuple[int, int]) -> int:
    """Every output under its final name decodes whole at the input's size; returns how many."""
    n = 0
    for p in folder.rglob("*"):
        if p.name.endswith("_seg.png"):
            img = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
            assert img is not None and img.shape == shape, p
        elif p.name.endswith("_overlay.png"):
            img = cv2.imread(str(p))
            assert img is not None and img.shape == (*shape, 3), p
        elif p.suffix == ".npy":
            assert np.load(p).shape == shape, p
        else:
            continue
        n += 1
    return n


def fill(path: Path, leave: int = 0) -> None:
    """Takes the free space of path's file system, but `leave` bytes."""
    free = os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        left = max(free - leave, 0)
        while left > 0:
            try:
                left -= os.write(fd, b"\0" * min(left, 65536))
            except OSError:
                break
    finally:
        os.close(fd)


@pytest.fixture
def small_fs(tmp_path):
    """mount(size) -> a fresh tmpfs of that many bytes; skips where mounting is not allowed."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs",
                            str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or 'mount failed'}); "
                        "the file size limit tests cover failed writes without one")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("photos")
    paths = []
    for i in range(4):
        noise_image(d / f"p{i}.png", 120, 160, i)
        paths.append(d / f"p{i}.png")
    return paths


# ---- a full output file system -----------------------------------------------------------------

def test_a_disk_that_fills_keeps_only_complete_files_and_says_which_failed(small_fs, photos):
    # Each photo's outputs take ~100 KB (a 57 KB overlay of noise, 154 KB int64 labels ...):
    # 256 KB holds some, not all.
    out = small_fs(256 * 1024)
    r = cli("segment", *photos, "-o", out, "--model", TINY, "--workers", "1")
    assert r.returncode == 19, r.stderr
    assert "No space left on device" in r.stderr
    assert not temp_files(out)
    check_complete(out, (120, 160))
    summary_file = out / "summary.json"
    if summary_file.exists():  # written when it fits in what the failed files gave back
        entries = json.loads(summary_file.read_text())["images"]
        assert sorted(Path(e["input"]).name for e in entries) == [p.name for p in photos]
        failed = [e for e in entries if e["status"] == "error"]
        assert failed and all(e["error"] == "io_error" for e in failed)
        for e in entries:  # every file an entry names is there (ok or not), and complete
            assert all(Path(f).exists() for f in e["outputs"].values()), e
    else:
        assert "summary.json" in r.stderr


def test_a_disk_with_no_space_left_writes_nothing_partial(small_fs, photos):
    out = small_fs(64 * 1024)
    fill(out / "filler")
    r = cli("segment", *photos[:2], "-o", out, "--model", TINY, "--save", "labels,json")
    assert r.returncode == 19, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["filler"], r.stderr
    assert "cannot write" in r.stderr and "summary.json" in r.stderr
    # The plain lines say nothing was written: only errors.
    assert "->" not in r.stdout


def test_label_frames_on_a_disk_that_fills(small_fs, tmp_path):
    clip = noise_video(tmp_path / "noise.mp4", seconds=4)
    out = small_fs(96 * 1024)  # ~20 KB per frame's labels: some frames fit
    r = cli("segment", clip, "-o", out, "--model", TINY, "--save", "labels,overlay,json",
            "--batch-size", "8")
    assert r.returncode == 19, r.stderr
    assert not temp_files(out)
    frames = sorted((out / "noise_frames").glob("*.png"))
    assert frames, "some frames fit"
    for f in frames:
        assert cv2.imread(str(f), cv2.IMREAD_UNCHANGED).shape == (120, 160)
    assert not (out / "noise_overlay.mp4").exists()
    if (out / "summary.json").exists():
        (e,) = json.loads((out / "summary.json").read_text())["images"]
        assert e["status"] == "error" and e["error"] == "io_error"
        assert e["outputs"] == {"frames_dir": str(out / "noise_frames")}
        assert e["frames"] >= len(frames)


def test_a_json_stream_to_a_full_disk_is_an_io_error_not_a_closed_pipe(small_fs, photos,
                                                                       tmp_path):
    full = small_fs(16 * 1024)
    fill(full / "filler", leave=4096)
    out = tmp_path / "out"
    with open(full / "lines.jsonl", "w") as stream:
        r = subprocess.run([str(CLI), "segment", *map(str, photos), "-o", str(out), "--model",
                            str(TINY), "--json"], stdout=stream, stderr=subprocess.PIPE, text=True,
                           env=clean_env(), timeout=240)
    assert r.returncode == 19, r.stderr
    assert "cannot write to stdout" in r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cancelled"] is False  # the run went on: every input was segmented
    assert "No space left" in summary["stdout_error"]
    assert [e["status"] for e in summary["images"]] == ["ok"] * len(photos)
    assert check_complete(out, (120, 160)) == 4 * len(photos)


# ---- a file size limit (RLIMIT_FSIZE, ulimit -f) -----------------------------------------------

def test_a_file_size_limit_fails_the_large_outputs_not_the_run(photos, tmp_path):
    # The labels PNG (~20 KB) fits under 40 KB, the overlay of noise (~57 KB) and the int64
    # labels (154 KB) do not: each input is an error listing its labels PNG.
    out = tmp_path / "out"
    r = cli("segment", *photos[:2], "-o", out, "--model", TINY, fsize=40 * 1024)
    assert r.returncode == 19, (r.returncode, r.stderr)  # not -SIGXFSZ (killed) or 153
    assert "file size limit" in r.stderr and "40960 bytes" in r.stderr
    assert not temp_files(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outputs_failed"] == 2
    for e in summary["images"]:
        assert e["status"] == "error" and e["error"] == "io_error"
        assert "File too large" in e["message"]
        assert set(e["outputs"]) == {"labels_png"}
        assert cv2.imread(e["outputs"]["labels_png"], cv2.IMREAD_UNCHANGED).shape == (120, 160)
    assert not list(out.glob("*_overlay.png")) and not list(out.glob("*.npy"))
    # A resumed run without the limit completes them and keeps the names.
    r = cli("segment", *photos[:2], "-o", out, "--model", TINY, "--skip-existing")
    assert r.returncode == 0, r.stderr
    assert check_complete(out, (120, 160)) == 8


def test_an_overlay_video_over_the_file_size_limit_is_not_kept(tmp_path):
    clip = noise_video(tmp_path / "noise.mp4", seconds=3)
    out = tmp_path / "out"
    r = cli("segment", clip, "-o", out, "--model", TINY, "--save", "overlay,json",
            "--codec", "mp4v", fsize=48 * 1024)
    assert r.returncode == 19, r.stderr
    (e,) = json.loads((out / "summary.json").read_text())["images"]
    assert e["status"] == "error" and e["error"] == "io_error", e
    assert "noise_overlay.mp4" in e["message"] and e["outputs"] == {}
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


# ---- two runs into one folder -------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow_folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("slow")
    for i in range(24):
        noise_image(d / f"big_{i:02d}.png", 600, 500, i)
    return d


def test_a_second_run_into_a_busy_folder_stops_with_the_holder_named(slow_folder, tmp_path):
    out = tmp_path / "out"
    first = subprocess.Popen([str(CLI), "segment", str(slow_folder), "-o", str(out), "--model",
                              str(TINY), "--batch-size", "2"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        lock = out / ".sapiens-seg.lock"
        deadline = time.monotonic() + 60
        while not (lock.exists() and lock.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.exists(), "the first run takes the folder's lock"
        # Frozen while the second run tries the folder, so that it cannot finish its 24 photos
        # first (on a fast CPU it did, and then rightly exited 0 on the SIGTERM below).
        first.send_signal(signal.SIGSTOP)
        (tmp_path / "other").mkdir()
        noise_image(tmp_path / "other" / "big_00.jpg", 64, 64, 99)  # same stem, other photo
        r = cli("segment", tmp_path / "other" / "big_00.jpg", "-o", out, "--model", TINY)
        assert r.returncode == 19, r.stderr
        assert "another sapiens-seg run" in r.stderr and f"pid {first.pid}" in r.stderr
        assert ".sapiens-seg.lock" in r.stderr
        alive = first.poll() is None
        first.send_signal(signal.SIGTERM)  # no need to wait for 24 photos
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
    done = len(json.loads((out / "summary.json").read_text())["images"])
    assert first.returncode == 143, (alive, done, err)
    assert not lock.exists(), "the lock file goes with its run"
    summary = json.loads((out / "summary.json").read_text())
    assert all(Path(e["input"]).parent == slow_folder for e in summary["images"])
    # After it, the same photo runs, and names itself around the first run's files.
    before = {p.name: p.read_bytes() for p in out.glob("big_00*")}
    r = cli("segment", tmp_path / "other" / "big_00.jpg", "-o", out, "--model", TINY,
            "--skip-existing")
    assert r.returncode == 0, r.stderr
    assert {p.name: p.read_bytes() for p in out.glob("big_00*") if p.name in before} == before


# ---- a run killed with SIGKILL, then resumed ----------------------------------------------------

def test_a_resume_after_kill_9_leaves_no_temporary_file(slow_folder, tmp_path):
    out = tmp_path / "out"
    p = subprocess.Popen([str(CLI), "segment", str(slow_folder), "-o", str(out), "--model",
                          str(TINY), "--batch-size", "2", "--save", "labels,overlay,npy,logits"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env())
    # Killed while it writes (the float32 logits take a while): a temporary file is there.
    deadline = time.monotonic() + 120
    while not temp_files(out) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.002)
    p.kill()
    p.wait(timeout=30)
    left = temp_files(out)
    # Stale temporary files of every kind a run writes, as a kill leaves them.
    (out / "clip_frames").mkdir(parents=True, exist_ok=True)
    planted = [out / "big_99_seg.png.tmp4000000.png", out / "clip_overlay.partial.mp4",
               out / "clip_frames" / "frame_000003_seg.png.tmp4000000.png",
               out / "summary.json.tmp4000000.json"]
    for f in planted:
        f.write_bytes(b"partial")
    keep = [out / "holiday.tmp2023", out / "notes.tmp1.txt"]  # not names this tool writes
    for f in keep:
        f.write_bytes(b"mine")
    r = cli("segment", slow_folder, "-o", out, "--model", TINY, "--batch-size", "4",
            "--save", "labels", "--skip-existing")
    assert r.returncode == 0, r.stderr
    assert f"removed {len(left) + len(planted)} temporary file" in r.stderr
    assert sorted(temp_files(out)) == sorted(keep)
    assert len(list(out.glob("*_seg.png"))) == 24
