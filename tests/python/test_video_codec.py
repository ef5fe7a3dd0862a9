"""The overlay video's codec (`sapiens-seg segment VIDEO --codec auto|h264|mp4v`): H.264 where the
linked OpenCV/FFmpeg can encode it (checked with ffprobe, Debian's ffmpeg package, and decoded
with OpenCV), MPEG-4 Part 2 on request, and the fallback of `auto`, said in the log and the
JSON, where H.264 cannot be written.

The fallback is tested with an FFmpeg that has no H.264 encoder: a small preloaded library
(compiled here) makes libavcodec's avcodec_find_encoder() answer "none" for H.264, which is
what OpenCV's writer sees on an FFmpeg built without libx264.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import FIXTURES, CLI
TINY = FIXTURES / "tiny_a_torchscript.pt2"
FFPROBE = shutil.which("ffprobe")
FFMPEG = shutil.which("ffmpeg")

NO_H264_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <libavcodec/avcodec.h>
const AVCodec* avcodec_find_encoder(enum AVCodecID id) {
  static const AVCodec* (*real)(enum AVCodecID);
  if (real == NULL) real = (const AVCodec* (*)(enum AVCodecID))dlsym(RTLD_NEXT, "avcodec_find_encoder");
  return id == AV_CODEC_ID_H264 ? NULL : real(id);
}
"""

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")
needs_ffprobe = pytest.mark.skipif(FFPROBE is None,
                                   reason="ffprobe not found (Debian package ffmpeg; tools/setup.sh "
                                          "installs it)")


@pytest.fixture(scope="module")
def no_h264(tmp_path_factory):
    """The environment of an FFmpeg without an H.264 encoder (LD_PRELOAD of the shim above)."""
    d = tmp_path_factory.mktemp("noh264")
    (d / "noh264.c").write_text(NO_H264_SHIM)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the no-H.264 shim")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", str(d / "noh264.c"), "-o",
                        str(d / "noh264.so"), "-ldl"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build the no-H.264 shim (libavcodec-dev headers?): {r.stderr}")
    return {"LD_PRELOAD": str(d / "noh264.so")}


def clip(path: Path, width: int, height: int, frames: int = 15, fps: int = 10) -> Path:
    vw = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    for f in range(frames):
        frame = np.full((height, width, 3), 12 * f, np.uint8)
        cv2.rectangle(frame, (4 * f, 8), (4 * f + 24, height - 16), (0, 0, 255), -1)
        vw.write(frame)
    vw.release()
    return path


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return clip(tmp_path_factory.mktemp("video") / "clip.mp4", 96, 64)


def segment(video: Path, out: Path, *args, env=None):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SAPIENS_SEG_", "HF_", "OPENCV_", "LD_PRELOAD"))}
    e.update(env or {})
    r = subprocess.run([str(CLI), "segment", str(video), "-o", str(out), "--model", str(TINY),
                        "--stride", "2", "--save", "overlay,labels,json", "--json", *args],
                       capture_output=True, text=True, env=e, timeout=600)
    line = json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 else None
    return r, line


def probe(path: Path) -> dict:
    r = subprocess.run([FFPROBE, "-v", "error", "-select_streams", "v:0", "-count_frames",
                        "-show_entries",
                        "stream=codec_name,codec_tag_string,pix_fmt,width,height,r_frame_rate,"
                        "nb_frames,nb_read_frames", "-of", "json", str(path)],
                       capture_output=True, text=True, timeout=60, check=True)
    return json.loads(r.stdout)["streams"][0]


def frames(path: Path) -> list:
    cap = cv2.VideoCapture(str(path))
    out = []
    while True:
        ok, frame = cap.read()
        if not ok:
            return out
        out.append(frame)


def assert_is_the_overlay(decoded, video, out_dir):
    """The decoded frames show the overlay of the label PNGs written beside them (palette at 0.5
    over the input frame), up to the codec's loss: far closer to it than the input frames are.
    (The random-weight fixture's labels are speckled, which a codec at this size blurs.)"""
    palette = np.array(json.loads((FIXTURES / "cards" / "tiny_a.json").read_text())
                       ["labels"]["palette"], np.uint8)[:, ::-1]  # RGB -> BGR
    inputs = frames(video)[::2]
    assert len(inputs) == len(decoded)
    for i, (got, image) in enumerate(zip(decoded, inputs)):
        labels = cv2.imread(str(out_dir / "clip_frames" / f"frame_{2 * i:06d}_seg.png"),
                            cv2.IMREAD_UNCHANGED)
        want = (image * 0.5 + palette[labels] * 0.5).astype(np.uint8)
        err = np.abs(got.astype(int) - want).mean()
        assert err < 0.5 * np.abs(image.astype(int) - want).mean(), (i, err)


def h264_or_skip(r):
    if r.returncode == 19 and "cannot encode H.264" in r.stderr:
        pytest.skip(f"this OpenCV/FFmpeg cannot write H.264: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr


@needs_ffprobe
def test_h264_plays_where_browsers_play(video, tmp_path):
    r, line = segment(video, tmp_path / "h264", "--codec", "h264")
    h264_or_skip(r)
    out = Path(line["outputs"]["overlay_video"])
    assert out.name == "clip_overlay.mp4" and line["codec"] == "h264"
    assert "codec_fallback" not in line and "warning" not in r.stderr
    s = probe(out)
    # What browsers need: H.264 in MP4 ('avc1'), 4:2:0; every 2nd of 15 frames at 10/2 fps.
    assert (s["codec_name"], s["codec_tag_string"], s["pix_fmt"]) == ("h264", "avc1", "yuv420p")
    assert (s["width"], s["height"]) == (96, 64)
    assert s["r_frame_rate"] == "5/1"
    assert int(s["nb_frames"]) == int(s["nb_read_frames"]) == 8
    decoded = frames(out)
    assert len(decoded) == 8 and decoded[0].shape == (64, 96, 3)
    assert_is_the_overlay(decoded, video, out.parent)
    r, line = segment(video, tmp_path / "mp4v", "--codec", "mp4v")
    assert r.returncode == 0, r.stderr
    out = Path(line["outputs"]["overlay_video"])
    assert line["codec"] == "mp4v" and probe(out)["codec_name"] == "mpeg4"
    assert len(frames(out)) == 8


@needs_ffprobe
def test_auto_is_h264_where_it_can_be_written(video, tmp_path):
    r, line = segment(video, tmp_path, "--codec", "h264")
    h264_or_skip(r)
    r, line = segment(video, tmp_path / "auto")  # --codec auto is the default
    assert r.returncode == 0, r.stderr
    assert line["codec"] == "h264" and "codec_fallback" not in line
    assert probe(Path(line["outputs"]["overlay_video"]))["codec_name"] == "h264"


@needs_ffprobe
def test_odd_frame_sizes_are_padded_to_even_for_h264(tmp_path):
    # OpenCV's own writers round odd sizes down (and so would the CLI's, rescaling the frames):
    # the odd clip is made by ffmpeg, FFV1 4:4:4 in Matroska, which keeps 95 x 63.
    odd = tmp_path / "odd.mkv"
    subprocess.run([FFMPEG, "-v", "error", "-f", "lavfi", "-i", "testsrc=size=95x63:rate=10",
                    "-frames:v", "15", "-c:v", "ffv1", "-pix_fmt", "yuv444p", str(odd)], check=True,
                   timeout=60)
    r, line = segment(odd, tmp_path / "out", "--codec", "h264")
    h264_or_skip(r)
    assert (line["width"], line["height"]) == (95, 63)  # the input's size, as read
    s = probe(Path(line["outputs"]["overlay_video"]))
    assert (s["codec_name"], s["width"], s["height"]) == ("h264", 96, 64)
    decoded = frames(Path(line["outputs"]["overlay_video"]))
    assert len(decoded) == 8
    # The added column and row repeat the last ones.
    f = decoded[3].astype(int)
    assert np.abs(f[:, 95] - f[:, 94]).mean() < 8 and np.abs(f[63] - f[62]).mean() < 8


def test_auto_falls_back_to_mp4v_and_says_so(video, tmp_path, no_h264):
    r, line = segment(video, tmp_path, env=no_h264)
    assert r.returncode == 0, r.stderr
    assert line["codec"] == "mp4v"
    assert "cannot encode H.264" in line["codec_fallback"] and "mp4v" in line["codec_fallback"]
    assert "sapiens-seg: warning: " in r.stderr and "which browsers do not play" in r.stderr
    assert "[ERROR" not in r.stderr  # OpenCV's own messages about the failed attempt are muted
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["images"][0]["codec"] == "mp4v" and summary["images"][0]["codec_fallback"]
    out = Path(line["outputs"]["overlay_video"])
    assert len(frames(out)) == 8
    if FFPROBE:
        assert probe(out)["codec_name"] == "mpeg4"
    # --quiet keeps errors only: the warning goes, the JSON keeps the reason.
    r, line = segment(video, tmp_path / "quiet", "--quiet", env=no_h264)
    assert r.returncode == 0 and "warning" not in r.stderr and line["codec_fallback"]


def test_an_explicit_h264_that_cannot_be_written_is_an_error(video, tmp_path, no_h264):
    r, _ = segment(video, tmp_path, "--codec", "h264", env=no_h264)
    assert r.returncode == 19, r.stderr  # 10 + kIo
    assert "--codec h264" in r.stderr and "use --codec mp4v" in r.stderr
    assert not list(tmp_path.glob("*.mp4"))  # no partial video left behind
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["images"][0]["status"] == "error"


def test_the_codec_option_is_checked(video, tmp_path):
    r, _ = segment(video, tmp_path, "--codec", "vp9")
    assert r.returncode == 2 and "--codec" in r.stderr
