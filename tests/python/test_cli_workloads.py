"""`sapiens-seg segment` on real workloads: folders, lists, stdin, videos, batching, progress,
selectable outputs, --json lines (validated against a schema), --skip-existing, Ctrl-C."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import cv2
import jsonschema
import numpy as np
import pytest

from ptyrun import run_with_tty_stderr  # noqa: E402

from conftest import FIXTURES, CLI
TINY = FIXTURES / "tiny_a_torchscript.pt2"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")

# One line per input on stdout with --json.
LINE_SCHEMA = {
    "type": "object",
    "required": ["input", "status"],
    "properties": {"input": {"type": "string"}, "status": {"enum": ["ok", "error", "skipped"]}},
    "allOf": [
        {"if": {"properties": {"status": {"const": "ok"}}},
         "then": {"required": ["width", "height", "outputs"],
                  "properties": {"width": {"type": "integer", "minimum": 32},
                                 "height": {"type": "integer", "minimum": 32},
                                 "outputs": {"type": "object",
                                             "additionalProperties": {"type": "string"}},
                                 "classes": {"type": "object",
                                             "additionalProperties": {"type": "integer",
                                                                      "minimum": 1}},
                                 "timings_ms": {"type": "object",
                                                "additionalProperties": {"type": "number"}}}}},
        {"if": {"properties": {"status": {"const": "error"}}},
         "then": {"required": ["error", "message"],
                  "properties": {"error": {"type": "string"}, "message": {"type": "string"}}}},
    ],
}


def run(*args, stdin=None, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, env=env,
                          input=stdin, timeout=600, **kw)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """40 images of mixed sizes, a grey and an RGBA PNG in a sub-folder, and a corrupt file."""
    d = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(7)
    for i in range(40):
        h, w = int(rng.integers(32, 260)), int(rng.integers(32, 260))
        img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        cv2.ellipse(img, (w // 2, h // 2), (w // 3, h // 4), 0, 0, 360, (30, 180, 220), -1)
        cv2.imwrite(str(d / f"img_{i:03d}.{'jpg' if i % 3 == 0 else 'png'}"), img)
    (d / "sub").mkdir()
    cv2.imwrite(str(d / "sub" / "grey.png"), (rng.random((64, 80)) * 255).astype(np.uint8))
    cv2.imwrite(str(d / "sub" / "rgba.png"), (rng.random((70, 90, 4)) * 255).astype(np.uint8))
    (d / "sub" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    (d / "notes.txt").write_text("not an image: ignored by the extension filter")
    return d


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = tmp_path_factory.mktemp("video") / "clip.mp4"
    vw = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (96, 64))
    for f in range(15):
        frame = np.full((64, 96, 3), 12 * f, np.uint8)
        cv2.rectangle(frame, (4 * f, 8), (4 * f + 24, 48), (0, 0, 255), -1)
        vw.write(frame)
    vw.release()
    return path


def json_lines(stdout):
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    for line in lines:
        jsonschema.validate(line, LINE_SCHEMA)
    return lines


def test_folder_batched_equals_one_at_a_time(folder, tmp_path):
    out = tmp_path / "batched"
    r = run("segment", folder, "--recursive", "-o", out, "--model", TINY, "--batch-size", "8",
            "--json")
    assert r.returncode == 17, r.stderr  # some inputs failed: invalid input
    lines = json_lines(r.stdout)
    by_input = {Path(line["input"]).name: line for line in lines}
    assert len(lines) == 43 and "notes.txt" not in by_input
    assert by_input["corrupt.png"]["status"] == "error"
    assert "corrupt.png" in r.stderr
    ok = [line for line in lines if line["status"] == "ok"]
    assert len(ok) == 42
    for line in ok:
        assert sum(line["classes"].values()) == line["width"] * line["height"]
    # The same images one at a time, in a separate run.
    single = tmp_path / "single"
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".png", ".jpg")
                   and p.name != "corrupt.png")
    r = run("segment", *files, "-o", single, "--model", TINY, "--batch-size", "1",
            "--workers", "1", "--save", "npy")
    assert r.returncode == 0, r.stderr
    for f in files:
        a = np.load(out / f"{f.stem}_seg.npy")
        b = np.load(single / f"{f.stem}_seg.npy")
        assert np.array_equal(a, b), f
    # Grey and RGBA inputs follow the documented rules (3 equal channels / alpha dropped).
    assert np.load(out / "grey_seg.npy").shape == (64, 80)
    assert np.load(out / "rgba_seg.npy").shape == (70, 90)
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["images"]) == 43 and summary["cancelled"] is False


def test_lists_stdin_and_missing_inputs(folder, tmp_path):
    listed = sorted(folder.glob("img_00*.png"))[:3]
    lst = tmp_path / "list.txt"
    lst.write_text("# images for the run\n" + "\n".join(map(str, listed[:2])) + "\n\n")
    r = run("segment", f"@{lst}", "-", tmp_path / "missing.png", "-o", tmp_path / "out",
            "--model", TINY, "--json", stdin=f"{listed[2]}\n")
    assert r.returncode == 11, r.stderr  # one input not found
    lines = json_lines(r.stdout)
    assert sorted(Path(line["input"]).name for line in lines if line["status"] == "ok") == \
        sorted(p.name for p in listed)
    assert [line["error"] for line in lines if line["status"] == "error"] == ["not_found"]


def test_save_selection_and_the_demos_side_by_side(folder, tmp_path):
    src = folder / "img_001.png"
    r = run("segment", src, "-o", tmp_path, "--model", TINY, "--save", "overlay,mask,logits",
            "--overlay", "side-by-side")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["img_001.npy", "img_001.png", "img_001_logits.npy"]
    img = cv2.imread(str(src))
    vis = cv2.imread(str(tmp_path / "img_001.png"))
    assert vis.shape == (img.shape[0], 2 * img.shape[1], 3)
    assert np.array_equal(vis[:, : img.shape[1]], img)  # the input on the left, unchanged
    logits = np.load(tmp_path / "img_001_logits.npy")
    assert logits.shape == (28, *img.shape[:2]) and logits.dtype == np.float32
    mask = np.load(tmp_path / "img_001.npy")
    assert np.array_equal(mask, logits.argmax(0) > 0)
    r = run("segment", src, "-o", tmp_path, "--model", TINY, "--save", "labels,pictures")
    assert r.returncode == 17 and "unknown output 'pictures'" in r.stderr


def test_skip_existing_resumes_without_rewriting(folder, tmp_path):
    files = sorted(folder.glob("img_01*.png"))
    r = run("segment", *files[:3], "-o", tmp_path, "--model", TINY)
    assert r.returncode == 0
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*_seg.png")}
    r = run("segment", *files, "-o", tmp_path, "--model", TINY, "--skip-existing", "--json")
    assert r.returncode == 0, r.stderr
    status = {Path(line["input"]).name: line["status"] for line in json_lines(r.stdout)}
    assert [status[f.name] for f in files[:3]] == ["skipped"] * 3
    assert all(status[f.name] == "ok" for f in files[3:])
    assert all(p.stat().st_mtime_ns == before[p.name] for p in tmp_path.glob("*_seg.png")
               if p.name in before)


def test_video_overlay_and_frames(video, tmp_path):
    r = run("segment", video, "-o", tmp_path, "--model", TINY, "--stride", "2",
            "--batch-size", "4", "--save", "labels,overlay", "--json")
    assert r.returncode == 0, r.stderr
    (line,) = json_lines(r.stdout)
    assert line["frames"] == 8 and line["frames_read"] == 15
    cap = cv2.VideoCapture(str(tmp_path / "clip_overlay.mp4"))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    assert len(frames) == 8 and frames[0].shape == (64, 96, 3)
    assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(5.0, abs=0.1)
    pngs = sorted((tmp_path / "clip_frames").iterdir())
    assert [p.name for p in pngs][:2] == ["frame_000000_seg.png", "frame_000002_seg.png"]
    assert len(pngs) == 8
    assert not list(tmp_path.glob("*partial*"))


def test_progress_bar_on_a_terminal_only(folder, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    code, text = run_with_tty_stderr([CLI, "segment", folder, "-o", tmp_path / "a", "--model", TINY,
                                      "--batch-size", "4"], env)
    assert code == 0 and "/40 inputs" in text and "ETA" in text and "\r" in text
    r = run("segment", folder, "-o", tmp_path / "b", "--model", TINY)
    assert "ETA" not in r.stderr  # plain lines on a pipe
    assert r.stdout.count(" -> ") == 40
    r = run("segment", folder, "-o", tmp_path / "c", "--model", TINY, "--quiet")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""


def test_ctrl_c_stops_cleanly(tmp_path):
    # Large enough images that the run is still going when the signal arrives.
    d = tmp_path / "big"
    d.mkdir()
    rng = np.random.default_rng(1)
    for i in range(120):
        cv2.imwrite(str(d / f"big_{i:02d}.png"), (rng.random((900, 700, 3)) * 255).astype(np.uint8))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    p = subprocess.Popen([str(CLI), "segment", d, "-o", out, "--model", TINY, "--batch-size", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not list(out.glob("*_seg.png")) and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted" in err
    written = list(out.glob("*_seg.png"))
    assert 0 < len(written) < 120
    assert not [f for f in out.iterdir() if ".tmp" in f.name]
    for f in written:  # every file that exists is complete
        assert cv2.imread(str(f), cv2.IMREAD_UNCHANGED).shape == (900, 700)
        assert np.load(out / f.name.replace("_seg.png", "_seg.npy")).shape == (900, 700)
    assert json.loads((out / "summary.json").read_text())["cancelled"] is True
