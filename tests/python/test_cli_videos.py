"""Videos as phones, screen recorders and editing tools make them, through `sapiens-seg segment`:
labels in the orientation players show (MP4/MOV display matrices, whatever OpenCV release is
linked), a stream whose frame size changes mid-stream, variable frame rates and edit-list trims
(not flagged truncated; the overlay keeps the input's duration), an empty video track, a file
whose index is missing, and the same checks in MOV, MKV and WebM where they apply
(docs/cli-outputs.md, "Videos").

Every input is made here with ffmpeg (Debian 12's 5.1: `-metadata:s:v rotate=N` writes the
display matrix, the concat demuxer joins streams of different sizes); without ffmpeg the file
skips.

    SAPIENS_SEG_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/python/test_cli_videos.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import CLI, FIXTURES

TINY = FIXTURES / "tiny_a_torchscript.pt2"
FFMPEG = shutil.which("ffmpeg")
FFPROBE = shutil.which("ffprobe")

pytestmark = [
    pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built"),
    pytest.mark.skipif(not TINY.exists(), reason=f"no fixtures in {FIXTURES}"),
    pytest.mark.skipif(FFMPEG is None or FFPROBE is None,
                       reason="ffmpeg and ffprobe (Debian package ffmpeg) make and read the videos"),
]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}


def cli(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in (CLI, *args)], capture_output=True, text=True,
                          env=clean_env(), timeout=timeout)


def ffmpeg(*args) -> None:
    subprocess.run([FFMPEG, "-v", "error", "-y", *map(str, args)], check=True, timeout=120)


def probe(path: Path, entries: str) -> list[dict]:
    r = subprocess.run([FFPROBE, "-v", "error", "-select_streams", "v:0", "-count_frames",
                        "-show_entries", entries, "-of", "json", str(path)], capture_output=True,
                       text=True, check=True, timeout=60)
    return json.loads(r.stdout)["streams"]


def entries(r: subprocess.CompletedProcess) -> dict[str, dict]:
    return {Path(e["input"]).name: e for e in map(json.loads, r.stdout.splitlines())}


def read_frames(path: Path) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    frames = []
    while len(frames) < 1000:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f)
    return frames


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """An asymmetric picture (ffmpeg's test card) at 96x64, 10 fps, 2 s, H.264."""
    d = tmp_path_factory.mktemp("videos")
    ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10:duration=2", "-c:v", "libx264",
           "-pix_fmt", "yuv420p", d / "src.mp4")
    return d / "src.mp4"


# ---- display matrices (phones) ------------------------------------------------------------------

@pytest.mark.parametrize("container", ["mp4", "mov"])
def test_rotated_videos_are_segmented_as_players_show_them(src, tmp_path, container):
    rotated = []
    for angle in (90, 180, 270):
        f = tmp_path / f"rot{angle}.{container}"
        ffmpeg("-i", src, "-c", "copy", "-metadata:s:v:0", f"rotate={angle}", f)
        rotated.append(f)
        # What players show: ffmpeg's own auto-rotated first frame, as a photo for the CLI.
        ffmpeg("-i", f, "-frames:v", "1", tmp_path / f"shown{angle}.png")
    out = tmp_path / "out"
    r = cli("segment", *rotated, *[tmp_path / f"shown{a}.png" for a in (90, 180, 270)], "-o",
            out, "--model", TINY, "--save", "labels,overlay,npy", "--json")
    assert r.returncode == 0, r.stderr
    lines = entries(r)
    for angle in (90, 180, 270):
        name = f"rot{angle}.{container}"
        e = lines[name]
        assert "truncated" not in e and "warnings" not in e, e
        shown = np.load(lines[f"shown{angle}.png"]["outputs"]["labels_npy"])
        frame0 = cv2.imread(str(Path(e["outputs"]["frames_dir"]) / "frame_000000_seg.png"),
                            cv2.IMREAD_UNCHANGED)
        assert frame0.shape == shown.shape, (angle, frame0.shape, shown.shape)
        assert (e["width"], e["height"]) == (shown.shape[1], shown.shape[0])
        agree = float(np.mean(frame0 == shown))
        turned = float(np.mean(np.rot90(frame0, 2) == shown))
        assert agree > 0.97, (angle, agree)  # the same picture, decoded by two programs
        assert turned < agree - 0.2, (angle, turned)  # and the test tells the turns apart
        # The clockwise turn applied: ffmpeg 5.1's rotate=90 tag means a quarter turn the other
        # way (its own player turns the frame counter-clockwise).
        assert e["rotation"] == {90: 270, 180: 180, 270: 90}[angle]
        video = probe(Path(e["outputs"]["overlay_video"]), "stream=width,height,nb_read_frames")
        assert (video[0]["width"], video[0]["height"]) == (e["width"], e["height"])
        assert int(video[0]["nb_read_frames"]) == 20


# ---- a frame size that changes mid-stream (screen recordings, stream switches) -----------------

SIZE_CASES = {  # name: (container, encoder, order of the 96x64 "a" and 128x96 "b" parts)
    "mp4-grows": ("mp4", "libx264", "aba"), "mp4-shrinks": ("mp4", "libx264", "bab"),
    "mkv-h264": ("mkv", "libx264", "aba"), "webm-vp9": ("webm", "libvpx-vp9", "aba"),
    "webm-vp8": ("webm", "libvpx", "aba"),
}


@pytest.fixture(scope="module")
def size_change(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sizes")
    made = {}
    for case, (container, encoder, order) in SIZE_CASES.items():
        part = "ts" if encoder == "libx264" else "webm"
        for name, card, size in (("a", "testsrc", "96x64"), ("b", "testsrc2", "128x96")):
            f = d / f"{name}_{encoder}.{part}"
            if not f.exists():
                ffmpeg("-f", "lavfi", "-i", f"{card}=size={size}:rate=10:duration=1", "-c:v",
                       encoder, "-g", "10", *(["-bf", "0"] if encoder == "libx264" else []),
                       "-pix_fmt", "yuv420p", f)
        (d / f"{case}.txt").write_text("".join(f"file '{d}/{c}_{encoder}.{part}'\n"
                                               for c in order))
        made[case] = d / f"{case}.{container}"
        ffmpeg("-f", "concat", "-safe", "0", "-i", d / f"{case}.txt", "-c", "copy", made[case])
    return made


@pytest.mark.parametrize("case", list(SIZE_CASES))
def test_frames_of_another_size_are_segmented_at_their_own_size(size_change, tmp_path, case):
    video = size_change[case]
    order = SIZE_CASES[case][2]
    out = tmp_path / "out"
    r = cli("segment", video, "-o", out, "--model", TINY, "--save", "labels,overlay", "--json",
            "--batch-size", "10")
    assert r.returncode == 0, r.stderr
    (e,) = entries(r).values()
    first = (96, 64) if order == "aba" else (128, 96)
    assert (e["width"], e["height"]) == first
    assert e["frames_read"] == 30
    frames_dir = Path(e["outputs"]["frames_dir"])
    written = sorted(int(p.name[6:12]) for p in frames_dir.glob("frame_*_seg.png"))
    # FFmpeg's decoder gives every frame at its own size: each is segmented at that size, none is
    # skipped and none repeats a stale picture.
    assert "frames_not_segmented" not in e, e
    assert written == list(range(30)) and e["frames"] == 30
    for i, size in ((5, first), (15, (128, 96) if order == "aba" else (96, 64)), (25, first)):
        labels = cv2.imread(str(frames_dir / f"frame_{i:06d}_seg.png"), cv2.IMREAD_UNCHANGED)
        assert labels.shape[::-1] == size, i


# ---- variable frame rates and edit lists ---------------------------------------------------------

@pytest.fixture(scope="module")
def vfr(tmp_path_factory) -> dict[str, Path]:
    """19 frames over 3.03 s: ten at 30 fps, then one every 0.3 s."""
    d = tmp_path_factory.mktemp("vfr")
    made = {}
    for ext in ("mp4", "mov", "mkv"):
        made[ext] = d / f"vfr.{ext}"
        ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=30:duration=3.3", "-vf",
               "select='lt(n\\,10)+not(mod(n\\,9))'", "-vsync", "vfr", "-c:v", "libx264",
               "-pix_fmt", "yuv420p", made[ext])
    return made


@pytest.mark.parametrize("ext", ["mp4", "mov", "mkv"])
def test_a_variable_frame_rate_is_not_truncated_and_keeps_its_duration(vfr, tmp_path, ext):
    out = tmp_path / "out"
    r = cli("segment", vfr[ext], "-o", out, "--model", TINY, "--save", "overlay", "--json")
    assert r.returncode == 0, r.stderr
    (e,) = entries(r).values()
    assert "truncated" not in e and "warnings" not in e, e
    assert e["frames"] == e["frames_read"] == e["frames_in_container"] == 19
    assert e["variable_frame_rate"] is True
    frames = read_frames(Path(e["outputs"]["overlay_video"]))
    fps = cv2.VideoCapture(e["outputs"]["overlay_video"]).get(cv2.CAP_PROP_FPS)
    assert abs(len(frames) / fps - e["duration_s"]) <= 1.5 / fps, (len(frames), fps)
    assert abs(e["duration_s"] - 3.03) < 0.05
    # Each input frame is shown at its own time: the frame at 2.1 s (input frame 16 of 19) is
    # on screen from 2.1 s to 2.4 s.
    def diff(a, b):
        return float(np.mean(np.abs(a.astype(int) - b.astype(int))))
    at = {t: frames[int(round(t * fps))] for t in (1.95, 2.15, 2.35)}
    assert diff(at[2.15], at[2.35]) < 2 < 4 < diff(at[1.95], at[2.15])


@pytest.mark.parametrize("ext", ["mp4", "mov"])
def test_an_edit_list_trim_is_not_truncated(src, tmp_path, ext):
    gop = tmp_path / "gop.mp4"
    ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10:duration=4", "-c:v", "libx264",
           "-g", "20", "-pix_fmt", "yuv420p", gop)
    trim = tmp_path / f"trim.{ext}"
    ffmpeg("-ss", "1.35", "-i", gop, "-c", "copy", trim)  # keeps the GOP, hides its head
    shown = int(probe(trim, "stream=nb_read_frames")[0]["nb_read_frames"])
    r = cli("segment", trim, "-o", tmp_path / "out", "--model", TINY, "--save", "labels",
            "--json")
    assert r.returncode == 0, r.stderr
    (e,) = entries(r).values()
    assert "truncated" not in e and "warnings" not in e, e
    assert e["frames"] == e["frames_in_container"] == shown < 30


def test_a_cut_copy_is_still_flagged_truncated_in_mov(src, tmp_path):
    whole = tmp_path / "whole.mov"
    ffmpeg("-i", src, "-c", "copy", "-movflags", "+faststart", whole)
    cut = tmp_path / "cut.mov"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    r = cli("segment", cut, "-o", tmp_path / "out", "--model", TINY, "--save", "labels",
            "--json")
    assert r.returncode == 0, r.stderr
    (e,) = entries(r).values()
    assert e["truncated"] is True and e["frames_in_container"] == 20
    assert 0 < e["frames_read"] < 20 and "the file ends inside the data" in e["warnings"][0]


def test_a_copy_cut_before_its_index_says_so(src, tmp_path):
    cut = tmp_path / "cut.mp4"  # ffmpeg writes the index (moov) last unless told otherwise
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    r = cli("segment", cut, "-o", tmp_path / "out", "--model", TINY, "--save", "labels")
    assert r.returncode == 17, r.stderr
    assert "no index (moov box)" in r.stderr
    assert not (tmp_path / "out" / "cut_frames").exists()


def test_an_empty_video_track_leaves_no_frames_folder(tmp_path):
    empty = tmp_path / "empty.mp4"
    ffmpeg("-f", "lavfi", "-i", "sine=duration=1", "-f", "lavfi", "-i",
           "testsrc=size=96x64:rate=10:duration=1", "-map", "0", "-map", "1", "-frames:v", "0",
           "-c:v", "libx264", "-c:a", "aac", "-movflags", "+empty_moov+frag_keyframe", empty)
    out = tmp_path / "out"
    r = cli("segment", empty, "-o", out, "--model", TINY, "--save", "labels,overlay,json")
    assert r.returncode == 17, r.stderr
    assert "has no video frames" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_a_timestamp_jump_does_not_fill_the_overlay_with_repeats(tmp_path):
    # Frames 3-5 are due 10^5 s after frame 2 (a damaged or hostile file of 2 KB; its header's
    # duration says 10^5 s too): believed, the overlay would repeat frame 2 for a million slots.
    jump = tmp_path / "jump.mkv"
    ffmpeg("-f", "lavfi", "-i", "testsrc=size=64x48:rate=10", "-frames:v", "6", "-vf",
           "setpts='PTS+gte(N\\,3)*100000/TB'", "-c:v", "libx264", "-pix_fmt", "yuv420p", jump)
    dur = subprocess.run([FFPROBE, "-v", "error", "-show_entries", "format=duration", "-of",
                          "csv=p=0", str(jump)], capture_output=True, text=True, check=True,
                         timeout=60)
    assert float(dur.stdout) > 1e5  # the jump is in the file
    out = tmp_path / "out"
    r = cli("segment", jump, "-o", out, "--model", TINY, "--save", "labels,overlay", "--json",
            timeout=120)
    assert r.returncode == 0, r.stderr
    (e,) = entries(r).values()
    assert e["frames"] == 6 and e["frame_times_ignored"] == 3, e
    assert any("frame times" in w for w in e["warnings"]), e
    overlay = read_frames(Path(e["outputs"]["overlay_video"]))
    assert 6 <= len(overlay) <= 8, len(overlay)


# ---- other containers -----------------------------------------------------------------------------

@pytest.mark.parametrize("ext,codec", [("mkv", "libx264"), ("webm", "libvpx-vp9"),
                                       ("webm", "libvpx"), ("avi", "mpeg4")])
def test_other_containers_are_segmented_whole_and_cut_ones_flagged(tmp_path, ext, codec):
    # 12 s in clusters of 2 s (Matroska's demuxer drops a cluster that is cut); every 10th frame
    # is segmented, all are read.
    whole = tmp_path / f"whole.{ext}"
    ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64:rate=10:duration=12", "-c:v", codec,
           *(["-pix_fmt", "yuv420p", "-g", "20"] if codec != "mpeg4" else []),
           *(["-cluster_time_limit", "2000"] if ext != "avi" else []), whole)
    cut = tmp_path / f"cut.{ext}"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    r = cli("segment", whole, cut, "-o", tmp_path / "out", "--model", TINY, "--save",
            "labels,overlay", "--stride", "10", "--batch-size", "6", "--json")
    assert r.returncode == 0, r.stderr
    lines = entries(r)
    w = lines[whole.name]
    assert w["frames_read"] == 120 and w["frames"] == 12, w
    assert "truncated" not in w and "warnings" not in w, w
    frames = read_frames(Path(w["outputs"]["overlay_video"]))
    assert len(frames) == 12
    c = lines[cut.name]
    assert c["truncated"] is True and 0 < c["frames_read"] < 120, c
