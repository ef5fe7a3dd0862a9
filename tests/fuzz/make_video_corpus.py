#!/usr/bin/env python3
"""Writes the seed corpus of the video-reader fuzz target (tests/fuzz/corpus_videos/): tiny
videos (32x24, a few frames) of the containers and codecs phones, cameras and tools write, each
exercising a path of the project's own reader: display matrices (turns, mirrors, an odd angle),
a size change mid-stream, pixel formats libswscale converts differently (10-bit, 4:4:4, planar
RGB, grey, full range, palettes, alpha), edit lists and variable rates, cut files, and files
without a usable video stream.

    python3 tests/fuzz/make_video_corpus.py [OUT_DIR]

Needs the ffmpeg command (Debian's ffmpeg package, 5.1). Encoders write their version into
some files (x264, x265, libvpx), so a different ffmpeg writes slightly different bytes; the
paths each seed takes do not change. Reproducers of fuzzing findings are kept in the same folder
under names starting with ``regress_``; this script never touches them.
"""

from __future__ import annotations

import math
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# Far below the run's -max_len (32 KiB): small seeds keep the mutations on the headers and the
# first frames, where the reader's decisions are made.
MAX_SEED = 16 * 1024

# Bit-exact output and no metadata: the bytes depend on the encoders only, not on the time.
EXACT = ["-fflags", "+bitexact", "-flags:v", "+bitexact", "-map_metadata", "-1", "-threads", "1"]


def src(size: str = "32x24", frames: int = 6, rate: int = 10) -> list[str]:
    """A moving test picture (lavfi's testsrc2), then the output's frame count."""
    return ["-f", "lavfi", "-i", f"testsrc2=size={size}:rate={rate}", "-frames:v", str(frames)]


def ffmpeg(out: Path, *args: str) -> Path:
    cmd = ["ffmpeg", "-v", "error", "-y", *args, *EXACT, str(out)]
    subprocess.run(cmd, check=True)
    return out


def tkhd_matrix(data: bytes, matrix: list[int]) -> bytes:
    """The MP4 with its video track's matrix (a b u c d v x y w; a-d, x, y in 16.16, u v w in
    2.30) replaced: what phones and editors write to turn or mirror a picture, and what ffmpeg's
    rotate metadata cannot express (mirrors, odd angles)."""
    at = data.find(b"tkhd")
    assert at > 0, "no tkhd box"
    # version and flags, creation and modification times, track id, reserved, duration (times
    # and duration 64-bit in version 1), reserved, layer, group, volume, reserved.
    times = 8 if data[at + 4] == 1 else 4
    offset = at + 4 + 4 + 2 * times + 4 + 4 + times + 8 + 8
    return data[:offset] + struct.pack(">9i", *matrix) + data[offset + 36:]


def fixed(x: float) -> int:
    return round(x * 65536)


def corpus(tmp: Path) -> dict[str, bytes]:
    t = tmp
    files: dict[str, Path] = {}
    x264 = ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]

    # H.264 in MP4: B-frames (reordering, an edit list), the index at the end and at the front.
    files["h264.mp4"] = ffmpeg(t / "h264.mp4", *src(), *x264, "-bf", "2", "-g", "6")
    files["h264_faststart.mp4"] = ffmpeg(t / "h264_faststart.mp4", *src(), *x264, "-bf", "2",
                                         "-movflags", "+faststart")
    for turn in (90, 180, 270):
        files[f"h264_rotate{turn}.mp4"] = ffmpeg(t / f"rotate{turn}.mp4", "-i",
                                                 str(files["h264.mp4"]), "-c", "copy",
                                                 "-metadata:s:v:0", f"rotate={turn}")
    one, c45 = fixed(1), fixed(math.cos(math.pi / 4))
    w = 1 << 30
    plain = files["h264_faststart.mp4"].read_bytes()
    matrices = {
        "h264_mirror.mp4": [-one, 0, 0, 0, one, 0, fixed(32), 0, w],
        "h264_mirror_rotate90.mp4": [0, -one, 0, -one, 0, 0, 0, 0, w],
        "h264_odd45.mp4": [c45, c45, 0, -c45, c45, 0, 0, 0, w],
        "h264_zero_matrix.mp4": [0, 0, 0, 0, 0, 0, 0, 0, w],
        # A mirror whose element has no 32-bit negative (the reader once negated it: UB).
        "h264_mirror_int32_min.mp4": [-(1 << 31), 0, 0, 0, one, 0, 0, 0, w],
    }
    blobs: dict[str, bytes] = {name: tkhd_matrix(plain, m) for name, m in matrices.items()}

    # A variable frame rate (steps growing), as phones write when light drops.
    files["h264_vfr.mp4"] = ffmpeg(t / "vfr.mp4", *src(frames=8), "-vf",
                                   "setpts=(N+N*N/4)/10/TB", "-fps_mode", "passthrough", *x264)
    # Pixel formats converted differently: 10 bits, 4:4:4, planar RGB (x264rgb), grey, palettes.
    files["h264_10bit.mkv"] = ffmpeg(t / "10bit.mkv", *src(frames=3), "-c:v", "libx264",
                                     "-preset", "veryfast", "-pix_fmt", "yuv420p10le")
    files["h264_444.mkv"] = ffmpeg(t / "444.mkv", *src(frames=3), "-c:v", "libx264", "-preset",
                                   "veryfast", "-pix_fmt", "yuv444p")
    files["h264rgb.mkv"] = ffmpeg(t / "rgb.mkv", *src(frames=3), "-c:v", "libx264rgb", "-preset",
                                  "veryfast")
    files["h264_bt709.mp4"] = ffmpeg(t / "bt709.mp4", *src(frames=3), *x264, "-colorspace",
                                     "bt709", "-color_primaries", "bt709", "-color_trc", "bt709",
                                     "-color_range", "tv")
    files["h264.h264"] = ffmpeg(t / "raw.h264", *src(frames=4), *x264, "-bf", "2", "-f", "h264")
    files["ffv1_gray.mkv"] = ffmpeg(t / "gray.mkv", *src(frames=3), "-c:v", "ffv1", "-pix_fmt",
                                    "gray")
    files["ffv1_bgr0.nut"] = ffmpeg(t / "bgr0.nut", *src(frames=3), "-c:v", "ffv1", "-pix_fmt",
                                    "bgr0")
    files["png_rgba.avi"] = ffmpeg(t / "rgba.avi", *src(frames=2), "-c:v", "png", "-pix_fmt",
                                   "rgba")
    files["pal8.gif"] = ffmpeg(t / "pal8.gif", *src(frames=3))
    files["anim.apng"] = ffmpeg(t / "anim.apng", *src(frames=3), "-f", "apng")
    files["yuv420p.y4m"] = ffmpeg(t / "yuv.y4m", *src(frames=3), "-pix_fmt", "yuv420p")

    # VP8 and VP9 in Matroska and WebM, and a VP8 stream whose size changes at a key frame.
    vpx = ["-deadline", "realtime", "-cpu-used", "8", "-b:v", "100k"]
    files["vp8.mkv"] = ffmpeg(t / "vp8.mkv", *src(), "-c:v", "libvpx", *vpx)
    files["vp9.mkv"] = ffmpeg(t / "vp9.mkv", *src(), "-c:v", "libvpx-vp9", *vpx)
    files["vp9_444.webm"] = ffmpeg(t / "vp9_444.webm", *src(frames=3), "-c:v", "libvpx-vp9", *vpx,
                                   "-pix_fmt", "yuv444p")
    files["vp8_alpha.webm"] = ffmpeg(t / "vp8a.webm", *src(frames=3), "-c:v", "libvpx", *vpx,
                                     "-pix_fmt", "yuva420p", "-auto-alt-ref", "0")
    files["vp8.ivf"] = ffmpeg(t / "vp8.ivf", *src(frames=3), "-c:v", "libvpx", *vpx)
    a = ffmpeg(t / "a.webm", *src(frames=3), "-c:v", "libvpx", *vpx)
    b = ffmpeg(t / "b.webm", *src(size="48x32", frames=3), "-c:v", "libvpx", *vpx)
    files["vp8_sizes.mkv"] = concat(t, "vp8_sizes.mkv", [a, b])

    # AVI: MPEG-4 Part 2 with packed B-frames, MJPEG (full-range YUV).
    files["mpeg4.avi"] = ffmpeg(t / "mpeg4.avi", *src(), "-c:v", "mpeg4", "-bf", "2", "-q:v", "8")
    files["mjpeg.avi"] = ffmpeg(t / "mjpeg.avi", *src(frames=3), "-c:v", "mjpeg", "-pix_fmt",
                                "yuvj420p", "-q:v", "10")

    # MPEG-TS whose H.264 stream changes size mid-stream (two recordings joined without
    # re-encoding), MPEG-2 in a program stream, FLV, Ogg Theora, HEVC.
    c = ffmpeg(t / "c.ts", *src(frames=3), *x264)
    d = ffmpeg(t / "d.ts", *src(size="48x32", frames=3), *x264)
    files["h264_sizes.ts"] = concat(t, "h264_sizes.ts", [c, d])
    files["mpeg2.mpg"] = ffmpeg(t / "mpeg2.mpg", *src(), "-c:v", "mpeg2video", "-bf", "2",
                                "-q:v", "8", "-f", "vob")
    files["flv1.flv"] = ffmpeg(t / "flv1.flv", *src(frames=3), "-c:v", "flv1", "-q:v", "8")
    files["theora.ogv"] = ffmpeg(t / "theora.ogv", *src(frames=3), "-c:v", "libtheora", "-q:v", "3")
    hevc = ffmpeg(t / "hevc.mp4", *src(frames=3), "-c:v", "libx265", "-preset", "ultrafast",
                  "-x265-params", "log-level=none")
    files["hevc_rotate90.mp4"] = ffmpeg(t / "hevc_rotate90.mp4", "-i", str(hevc), "-c", "copy",
                                        "-metadata:s:v:0", "rotate=90")

    # Video with sound (the other streams are discarded), sound alone (no video stream), sound
    # with cover art (a picture that is FFmpeg's best video stream, and no video), no frames.
    tone = ["-f", "lavfi", "-i", "sine=frequency=440:duration=0.3"]
    files["h264_aac.mp4"] = ffmpeg(t / "av.mp4", *tone, *src(frames=3), *x264, "-c:a", "aac",
                                   "-b:a", "16k", "-shortest")
    files["audio_only.m4a"] = ffmpeg(t / "a.m4a", *tone, "-c:a", "aac", "-b:a", "16k")
    cover = ffmpeg(t / "cover.png", *src(frames=1))
    files["audio_cover.m4a"] = ffmpeg(t / "cover.m4a", *tone, "-i", str(cover), "-map", "0",
                                      "-map", "1", "-c:a", "aac", "-b:a", "16k", "-c:v", "png",
                                      "-disposition:v:0", "attached_pic")
    files["no_frames.mkv"] = ffmpeg(t / "empty.mkv", *src(frames=0), "-c:v", "libvpx", *vpx)
    files["no_frames.mp4"] = ffmpeg(t / "empty.mp4", *src(frames=0), *x264)

    out = {name: p.read_bytes() for name, p in files.items()}
    out.update(blobs)
    # Cut files: an MP4 whose data stops inside a frame (index at the front), one whose index
    # never came (at the end), a Matroska file short of its header's duration, an AVI short of
    # its header's count.
    out["cut_h264_faststart.mp4"] = cut(out["h264_faststart.mp4"], 2 / 3)
    out["cut_h264_no_moov.mp4"] = cut(out["h264.mp4"], 2 / 3)
    out["cut_vp9.mkv"] = cut(out["vp9.mkv"], 1 / 2)
    out["cut_mpeg4.avi"] = cut(out["mpeg4.avi"], 1 / 2)
    out["cut_h264_sizes.ts"] = cut(out["h264_sizes.ts"], 1 / 2)
    return out


def concat(tmp: Path, name: str, parts: list[Path]) -> Path:
    """Parts joined by ffmpeg's concat demuxer without re-encoding: one stream, two sizes."""
    listing = tmp / (name + ".txt")
    listing.write_text("".join(f"file '{p}'\n" for p in parts))
    return ffmpeg(tmp / name, "-f", "concat", "-safe", "0", "-i", str(listing), "-c", "copy")


def cut(data: bytes, fraction: float) -> bytes:
    return data[: int(len(data) * fraction)]


def main() -> None:
    if shutil.which("ffmpeg") is None:
        sys.exit("make_video_corpus.py needs the ffmpeg command (Debian's ffmpeg package)")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "corpus_videos"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        seeds = corpus(Path(tmp))
    for name, data in sorted(seeds.items()):
        assert len(data) < MAX_SEED, f"{name}: {len(data)} bytes"
        (out / name).write_bytes(data)
    print(f"{len(seeds)} seed videos in {out}")


if __name__ == "__main__":
    main()
