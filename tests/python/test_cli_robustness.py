"""Nothing lost on real runs of `sapiens-seg segment`: output names that cannot collide or
replace an input, signals and closed pipes that end a run cleanly, truncated videos flagged,
special files refused at once, unreadable folders skipped, names escaped in plain text, and
outputs written without several full-size copies (docs/cli-outputs.md).

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES), or by hand:

    SAPIENS_SEG_BUILD=$PWD/build SAPIENS_SEG_FIXTURES=$PWD/build/fixtures \\
        .venv/bin/python -m pytest -q tests/python/test_cli_robustness.py
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SAPIENS_SEG_BUILD", REPO / "build"))
FIXTURES = Path(os.environ.get("SAPIENS_SEG_FIXTURES", BUILD / "fixtures"))
CLI = BUILD / "bin" / "sapiens-seg"
TINY = FIXTURES / "tiny_a_torchscript.pt2"

pytestmark = [
    pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built"),
    pytest.mark.skipif(not TINY.exists(), reason=f"no fixtures in {FIXTURES}"),
]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}


def cli(*args, timeout=300, **kw) -> subprocess.CompletedProcess:
    """The CLI with bytes stdout/stderr (names need not be UTF-8 or printable)."""
    return subprocess.run([os.fsencode(str(a)) if not isinstance(a, bytes) else a
                           for a in (CLI, *args)], capture_output=True, env=clean_env(),
                          timeout=timeout, **kw)


def write_image(path: Path, h: int, w: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    cv2.ellipse(img, (w // 2, h // 2), (w // 3, h // 4), 0, 0, 360, (30, 180, 220), -1)
    assert cv2.imwrite(str(path), img)


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp" in p.name or "partial" in p.name]


def check_entry_matches_its_files(entry: dict, h: int, w: int) -> None:
    """The files an entry names hold that input's outputs (its size; labels agree)."""
    outs = entry["outputs"]
    labels = np.load(outs["labels_npy"])
    mask = np.load(outs["mask_npy"])
    png = cv2.imread(outs["labels_png"], cv2.IMREAD_UNCHANGED)
    assert labels.dtype == np.int64 and labels.shape == (h, w)
    assert mask.dtype == np.bool_ and np.array_equal(mask, labels > 0)
    assert np.array_equal(png.astype(np.int64), labels)
    assert entry["height"] == h and entry["width"] == w


# ---- output names ----------------------------------------------------------------------------

def test_an_input_named_like_another_inputs_output_shares_no_file(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    write_image(d / "x.jpg", 48, 64, 1)
    write_image(d / "x_seg.jpg", 40, 72, 2)  # x.jpg's labels are x_seg.npy, x_seg.jpg's mask too
    out = tmp_path / "out"
    r = cli("segment", d, "-o", out, "--model", TINY, "--workers", "2")
    assert r.returncode == 0, r.stderr
    by_name = {Path(e["input"]).name: e for e in summary_of(out)["images"]}
    check_entry_matches_its_files(by_name["x.jpg"], 48, 64)
    check_entry_matches_its_files(by_name["x_seg.jpg"], 40, 72)
    files = [set(e["outputs"].values()) for e in by_name.values()]
    assert not files[0] & files[1]
    assert not temp_files(out)


def test_output_folder_inside_the_input_tree_is_not_read_back(tmp_path):
    d = tmp_path / "photos"
    (d / "sub").mkdir(parents=True)
    write_image(d / "a.png", 40, 48, 1)
    write_image(d / "sub" / "b.png", 44, 40, 2)
    out = d / "results"
    for attempt in range(2):
        r = cli("segment", d, "--recursive", "-o", out, "--model", TINY)
        assert r.returncode == 0, r.stderr
        entries = summary_of(out)["images"]
        assert sorted(Path(e["input"]).name for e in entries) == ["a.png", "b.png"], attempt
    assert b"not searched for inputs" in r.stderr
    assert not list(out.glob("*_seg_seg*"))


def test_output_folder_equal_to_the_input_folder_never_replaces_a_photo(tmp_path):
    d = tmp_path / "photos"
    d.mkdir()
    write_image(d / "photo.jpg", 48, 40, 1)
    write_image(d / "other.png", 40, 56, 2)
    before = {p.name: digest(p) for p in d.iterdir()}
    for attempt in range(2):
        r = cli("segment", d, "-o", d, "--model", TINY, "--overlay", "side-by-side")
        assert r.returncode == 0, (attempt, r.stderr)
        assert {p: digest(d / p) for p in before} == before, attempt
        entries = summary_of(d)["images"]
        # The second run does not take the first run's pictures as inputs.
        assert sorted(Path(e["input"]).name for e in entries) == ["other.png", "photo.jpg"]
    by_name = {Path(e["input"]).name: e for e in entries}
    sbs = cv2.imread(by_name["photo.jpg"]["outputs"]["overlay"])
    assert sbs.shape == (48, 80, 3)
    assert summary_of(d)["outputs_not_taken_as_inputs"] > 0
    assert b"not taken as inputs" in r.stderr


def test_skip_existing_segments_a_new_file_with_an_existing_stem(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    write_image(d / "a.jpg", 40, 40, 1)
    write_image(d / "a.png", 48, 40, 2)
    out = tmp_path / "out"
    r = cli("segment", d, "-o", out, "--model", TINY)
    assert r.returncode == 0, r.stderr
    first = {Path(e["input"]).name: e for e in summary_of(out)["images"]}
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "summary.json"}
    write_image(d / "a.bmp", 56, 48, 3)  # sorts before the others
    r = cli("segment", d, "-o", out, "--model", TINY, "--skip-existing", "--json")
    assert r.returncode == 0, r.stderr
    status = {Path(json.loads(line)["input"]).name: json.loads(line)["status"]
              for line in r.stdout.splitlines()}
    assert status == {"a.bmp": "ok", "a.jpg": "skipped", "a.png": "skipped"}
    entries = {Path(e["input"]).name: e for e in summary_of(out)["images"]}
    check_entry_matches_its_files(entries["a.bmp"], 56, 48)
    for name in ("a.jpg", "a.png"):  # kept as the first run wrote them, files untouched
        assert entries[name] == first[name]
    assert all(p.stat().st_mtime_ns == mtimes[p.name] for p in out.iterdir() if p.name in mtimes)
    # A file that ran alone keeps its names when a same-stem file joins it.
    solo = tmp_path / "solo"
    solo.mkdir()
    write_image(solo / "b.jpg", 40, 40, 4)
    out2 = tmp_path / "out2"
    assert cli("segment", solo, "-o", out2, "--model", TINY).returncode == 0
    write_image(solo / "b.png", 44, 40, 5)
    r = cli("segment", solo, "-o", out2, "--model", TINY, "--skip-existing")
    assert r.returncode == 0, r.stderr
    entries = {Path(e["input"]).name: e for e in summary_of(out2)["images"]}
    assert entries["b.jpg"]["status"] == "ok" and entries["b.jpg"]["outputs"]["labels_png"] \
        .endswith("/b_seg.png")
    check_entry_matches_its_files(entries["b.png"], 44, 40)


# ---- signals and closed pipes ----------------------------------------------------------------

@pytest.fixture(scope="module")
def many_images(tmp_path_factory):
    d = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(1)
    for i in range(60):
        cv2.imwrite(str(d / f"big_{i:02d}.png"), (rng.random((700, 600, 3)) * 255).astype(np.uint8))
    return d


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_signals_end_a_run_with_a_summary_and_no_temporary_file(many_images, tmp_path, sig):
    out = tmp_path / "out"
    p = subprocess.Popen([str(CLI), "segment", many_images, "-o", out, "--model", TINY,
                          "--batch-size", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env(), start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("*_seg.png")) and time.monotonic() < deadline:
        time.sleep(0.02)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err  # an exit status, not a death by the signal
    summary = summary_of(out)
    assert summary["cancelled"] is True and summary["cancelled_by"] == sig.name
    assert not temp_files(out)
    written = list(out.glob("*_seg.png"))
    assert 0 < len(written) < 60
    done = {Path(e["input"]).stem for e in summary["images"] if e["status"] == "ok"}
    assert done == {f.name[: -len("_seg.png")] for f in written}  # complete sets, all listed
    for f in written:
        assert np.load(out / f.name.replace("_seg.png", "_seg.npy")).shape == (700, 600)
        assert cv2.imread(str(out / f.name.replace("_seg.png", "_overlay.png"))).shape == \
            (700, 600, 3)


def test_a_closed_stdout_ends_the_run_like_a_signal(many_images, tmp_path):
    out = tmp_path / "out"
    p = subprocess.Popen([str(CLI), "segment", many_images, "-o", out, "--model", TINY, "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    first = json.loads(p.stdout.readline())  # `| head -1`
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=120)
    assert first["status"] == "ok"
    assert p.returncode == 141, err  # 128 + SIGPIPE, as an exit status (not killed: -13)
    summary = summary_of(out)
    assert summary["cancelled"] is True and summary["cancelled_by"].startswith("SIGPIPE")
    assert 0 < len(summary["images"]) < 60
    assert not temp_files(out)


# ---- videos ----------------------------------------------------------------------------------

def test_a_truncated_video_is_flagged(tmp_path):
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg (to move the MP4 index to the front, as cameras and web files do) "
                    "is not installed")
    src = tmp_path / "src.mp4"
    vw = cv2.VideoWriter(str(src), cv2.VideoWriter_fourcc(*"mp4v"), 10, (96, 64))
    for f in range(30):
        frame = np.full((64, 96, 3), 8 * f, np.uint8)
        cv2.rectangle(frame, (3 * f, 8), (3 * f + 24, 48), (0, 0, 255), -1)
        vw.write(frame)
    vw.release()
    whole = tmp_path / "whole.mp4"
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", src, "-c", "copy", "-movflags",
                    "+faststart", whole], check=True)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])  # a copy that stopped
    r = cli("segment", whole, cut, "-o", tmp_path / "out", "--model", TINY, "--save",
            "labels,json", "--json")
    assert r.returncode == 0, r.stderr
    lines = {Path(e["input"]).name: e for e in map(json.loads, r.stdout.splitlines())}
    assert lines["whole.mp4"]["frames"] == 30 and "truncated" not in lines["whole.mp4"]
    assert "warnings" not in lines["whole.mp4"]
    cut_entry = lines["cut.mp4"]
    assert cut_entry["truncated"] is True and cut_entry["frames_in_container"] == 30
    assert 0 < cut_entry["frames_read"] < 30
    assert "of the 30 frames" in cut_entry["warnings"][0]
    assert b"cut.mp4: truncated" in r.stderr


# ---- special files, folders that cannot be read ---------------------------------------------

def test_special_files_are_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    good = tmp_path / "good.png"
    write_image(good, 40, 40)
    t0 = time.monotonic()
    r = cli("segment", fifo, "/dev/null", good, "-o", tmp_path / "out", "--model", TINY,
            "--json", timeout=60)
    assert time.monotonic() - t0 < 30
    assert r.returncode == 17, r.stderr  # invalid input
    lines = {e["input"]: e for e in map(json.loads, r.stdout.splitlines())}
    assert lines[str(good)]["status"] == "ok"
    assert "FIFO" in lines[str(fifo)]["message"]
    assert "character device" in lines["/dev/null"]["message"]
    assert b"not found" not in r.stderr
    # --model: a FIFO is not opened (it would block), a folder is called a folder.
    for model, words in ((fifo, b"FIFO"), (tmp_path, b"is a folder")):
        r = cli("segment", good, "-o", tmp_path / "out2", "--model", model, timeout=60)
        assert r.returncode == 17, r.stderr
        assert words in r.stderr and b"safetensors file" not in r.stderr.split(b"(")[0]


def test_an_unreadable_sub_folder_is_one_error_and_the_walk_goes_on(tmp_path):
    # Root reads every folder: the run is made as "nobody" then, in a folder it may use.
    base = Path(tempfile.mkdtemp(prefix="sapiens_unreadable_"))
    try:
        os.chmod(base, 0o777)
        d = base / "in"
        for sub in ("a", "locked", "z"):
            (d / sub).mkdir(parents=True)
            write_image(d / sub / f"{sub}.png", 40, 40)
        for p in (d, d / "a", d / "z"):
            os.chmod(p, 0o755)
        for p in (d / "a" / "a.png", d / "z" / "z.png"):
            os.chmod(p, 0o644)
        os.chmod(d / "locked", 0)
        out = base / "out"
        demote = (lambda: (os.setgid(65534), os.setuid(65534))) if os.geteuid() == 0 else None
        r = subprocess.run([str(CLI), "segment", str(d), "--recursive", "-o", str(out),
                            "--model", str(TINY), "--json"], capture_output=True,
                           env=clean_env(), timeout=300, preexec_fn=demote)
        assert r.returncode == 19, r.stderr  # I/O error: one folder could not be read
        lines = [json.loads(line) for line in r.stdout.splitlines()]
        assert sorted(Path(e["input"]).name for e in lines if e["status"] == "ok") == \
            ["a.png", "z.png"]
        (bad,) = [e for e in lines if e["status"] == "error"]
        assert bad["input"] == str(d / "locked") and "Permission denied" in bad["message"]
        assert b"internal" not in r.stderr
    finally:
        os.chmod(base / "in" / "locked", 0o755)
        shutil.rmtree(base)


# ---- text for people and programs -------------------------------------------------------------

def test_control_characters_in_names_are_escaped_in_plain_text(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    names = ["new\nline.png", "\x1b[2Jwipe.png", "plain.png"]
    for i, n in enumerate(names):
        write_image(d / n, 40, 40 + i)
    (d / "bad\x1b[31m.png").write_bytes(b"not a png")
    r = cli("segment", d, "-o", tmp_path / "out", "--model", TINY)
    assert r.returncode == 17  # the bad one
    for stream in (r.stdout, r.stderr):
        assert b"\x1b" not in stream
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 3 and all(" -> " in line for line in lines)
    assert any("new\\x0Aline.png" in line for line in lines)
    assert b"bad\\x1B[31m.png" in r.stderr
    # JSON keeps the exact names.
    got = sorted(Path(e["input"]).name for e in summary_of(tmp_path / "out")["images"])
    assert got == sorted(names + ["bad\x1b[31m.png"])


def test_a_list_saved_with_a_byte_order_mark_and_crlf_loses_no_entry(tmp_path):
    imgs = []
    for i in range(3):
        imgs.append(tmp_path / f"l{i}.png")
        write_image(imgs[-1], 40, 40 + i, i)
    lst = tmp_path / "list.txt"
    lst.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(os.fsencode(p) for p in imgs) + b"\r\n")
    r = cli("segment", f"@{lst}", "-o", tmp_path / "out", "--model", TINY, "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(line)["input"] for line in r.stdout.splitlines()) == \
        sorted(map(str, imgs))


# ---- memory of the outputs ---------------------------------------------------------------------

def peak_rss(args: list) -> int:
    """Peak resident memory (bytes) of one CLI run, from its own rusage."""
    p = subprocess.Popen([str(CLI), *map(str, args)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=clean_env())
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    assert p.returncode == 0, p.stderr.read()
    return usage.ru_maxrss * 1024


def test_outputs_of_a_large_image_cost_about_one_full_size_picture(tmp_path):
    # 40 MP: before, the int64 labels were held twice (vector, then the .npy text: 16 bytes a
    # pixel) and the overlay three times (RGB, BGR, a copy: 9 bytes a pixel).
    h, w = 5000, 8000
    img = np.zeros((h, w, 3), np.uint8)
    cv2.circle(img, (w // 2, h // 2), h // 3, (40, 160, 220), -1)
    src = tmp_path / "large.png"
    assert cv2.imwrite(str(src), img)
    common = ["segment", src, "--model", TINY, "--workers", "1"]
    nothing = peak_rss([*common, "-o", tmp_path / "a", "--save", "json"])
    everything = peak_rss([*common, "-o", tmp_path / "b"])
    per_pixel = (everything - nothing) / (h * w)
    assert per_pixel < 5.0, f"the outputs cost {per_pixel:.1f} bytes a pixel above segmenting"


@pytest.mark.parametrize("h", [40, 130, 200, 221], ids=lambda h: f"{h}rows")
def test_overlays_made_in_strips_equal_the_whole_picture_rule(tmp_path, h):
    """At opacity 0 the overlay is the photo, at 1 the palette colour of each label: any strip
    out of place shows."""
    src = tmp_path / "in.png"
    write_image(src, h, 50, h)
    photo = cv2.imread(str(src))
    for opacity, style in (("0", "blend"), ("1", "blend"), ("0", "side-by-side")):
        out = tmp_path / f"out_{opacity}_{style}"
        r = cli("segment", src, "-o", out, "--model", TINY, "--opacity", opacity,
                "--overlay", style, "--save", "overlay,npy")
        assert r.returncode == 0, r.stderr
        pic = cv2.imread(str(out / ("in_overlay.png" if style == "blend" else "in.png")))
        labels = np.load(out / "in_seg.npy")
        if style == "side-by-side":
            assert np.array_equal(pic[:, :50], photo) and np.array_equal(pic[:, 50:], photo)
        elif opacity == "0":
            assert np.array_equal(pic, photo)
        else:
            colours = {}
            for k in np.unique(labels):
                got = np.unique(pic[labels == k], axis=0)
                assert len(got) == 1, (k, got)
                colours[int(k)] = tuple(got[0])
            assert len(set(colours.values())) == len(colours)
