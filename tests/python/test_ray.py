"""sapiens_seg.ray on a local Ray cluster: the command and the map_batches class give the CLI's
labels and statistics, a corrupt image fails only its row, a killed actor is replaced without
losing or duplicating output, and actors on one node download the weights once.

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES), or by hand:

    SAPIENS_SEG_BUILD=$PWD/build SAPIENS_SEG_FIXTURES=$PWD/build/fixtures \\
        .venv/bin/python -m pytest -q tests/python/test_ray.py

The cluster (2 CPUs, no dashboard) is started by the module and shut down at its end.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import CLI, FIXTURES, PKG_PARENT, REPO, use_built_package
HERE = Path(__file__).resolve().parent
TINY_B = FIXTURES / "tiny_b_torchscript.pt2"

ray = pytest.importorskip("ray", reason="Ray is not installed (tools/setup.sh installs ray[data])")
pytest.importorskip("ray.data", reason="Ray Data is not installed (ray[data])")
use_built_package()
if not TINY_B.exists() or not CLI.exists():
    pytest.skip(f"no fixtures in {FIXTURES} or no CLI at {CLI}", allow_module_level=True)


import cv2  # noqa: E402

from hub_server import HubServer  # noqa: E402
import sapiens_seg  # noqa: E402
from sapiens_seg.ray import _command, _segmenter  # noqa: E402
from sapiens_seg.ray import SapiensSegmenter, output_names, segment_dataset  # noqa: E402

# Ray's own deprecation notices about its configuration fields are not this project's concern.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")

# Inputs whose CLI run fails: a truncated JPEG (cannot be decoded) and an image below the
# network's 32-pixel minimum (decodes, then refused).
BAD = {"broken.jpg": "invalid_input", "small_20x20.png": "invalid_input"}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    env.update(extra)
    return env


def read_png(path) -> np.ndarray:
    a = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert a is not None and a.dtype == np.uint8 and a.ndim == 2, path
    return a


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """The fixture photos plus generated ones (noise, a grey image, a JPEG that shares its stem
    with a PNG: the CLI names them gen_noise_jpg and gen_noise_png), a corrupt file and one too small
    to segment."""
    d = tmp_path_factory.mktemp("images")
    for name in ("astronaut.jpg", "synth_300x211.png", "synth_33x47.png",
                 "synth_landscape_480x640.png"):
        shutil.copy(FIXTURES / "images" / name, d / name)
    rng = np.random.default_rng(9)
    cv2.imwrite(str(d / "gen_noise.png"), rng.integers(0, 256, (64, 96, 3), dtype=np.uint8))
    ramp = np.linspace(0, 255, 120 * 80 * 3).reshape(120, 80, 3).astype(np.uint8)
    cv2.imwrite(str(d / "gen_noise.jpg"), ramp, [cv2.IMWRITE_JPEG_QUALITY, 90])
    cv2.imwrite(str(d / "gen_grey.png"), rng.integers(0, 256, (50, 70), dtype=np.uint8))
    cv2.imwrite(str(d / "small_20x20.png"), np.full((20, 20, 3), 128, np.uint8))
    (d / "broken.jpg").write_bytes((FIXTURES / "images" / "astronaut.jpg").read_bytes()[:3000])
    return d


@pytest.fixture(scope="module")
def cli_out(images, tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """The CLI's label PNGs and summary for the same folder and model."""
    out = tmp_path_factory.mktemp("cli")
    r = subprocess.run([str(CLI), "-q", "segment", str(images), "-o", str(out), "--model",
                        str(TINY_B), "--save", "labels,json", "--batch-size", "2", "--threads",
                        "1"], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 17, r.stderr  # some inputs failed: the first one's code, invalid input
    summary = json.loads((out / "summary.json").read_text())
    by_name = {Path(e["input"]).name: e for e in summary["images"]}
    assert {n for n, e in by_name.items() if e["status"] == "error"} == set(BAD)
    return out, by_name


@pytest.fixture(scope="module")
def cluster():
    """A local 2-CPU Ray cluster for this module; its workers import this build's package and
    this folder's test classes."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_USAGE_STATS_ENABLED")}
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PKG_PARENT), str(HERE), saved["PYTHONPATH"]) if p)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_rows_equal_cli(rows, cli_out, key=lambda row: Path(row["path"]).name, png_names=None):
    """Every row's labels and statistics equal the CLI's; failed rows carry its error code. Label
    PNGs are named as the CLI names them, or by `png_names` (input file name -> PNG name)."""
    out, by_name = cli_out
    seen = [key(row) for row in rows]
    assert len(seen) == len(set(seen)), "a row appears twice"
    for row in rows:
        name = key(row)
        entry = by_name[name]
        if entry["status"] == "error":
            assert row["error_code"] == entry["error"], (name, row["error"])
            assert row["error"] and row["height"] == 0 and row["labels_png"] is None
            continue
        assert row["error"] is None, (name, row["error"])
        cli_png = Path(entry["outputs"]["labels_png"])
        expected = read_png(cli_png)
        if "labels" in row:
            assert np.array_equal(row["labels"], expected), name
        assert (row["height"], row["width"]) == expected.shape
        counts = {k: v for k, v in row["class_pixels"].items() if v}
        assert counts == entry["classes"], name
        assert sum(row["class_pixels"].values()) == expected.size
        assert abs(sum(row["class_fraction"].values()) - 1.0) < 1e-9
        if row["labels_png"] is not None:
            want = cli_png.name if png_names is None else png_names[name]
            assert Path(row["labels_png"]).name == want
            assert np.array_equal(read_png(row["labels_png"]), expected), name
    return seen


# ---- without a cluster --------------------------------------------------------------------------

def test_label_pngs_are_encoded_as_the_cli_encodes_them(images, cli_out):
    cli_dir, by_name = cli_out
    png = Path(by_name["astronaut.jpg"]["outputs"]["labels_png"])
    labels = read_png(png)
    assert sapiens_seg._core.encode_labels_png(labels) == png.read_bytes()
    with pytest.raises(ValueError, match="2-D"):
        sapiens_seg._core.encode_labels_png(np.zeros((2, 2, 3), np.uint8))


def test_output_names_follow_the_cli():
    # The library's rule (src/cli/naming.hpp): a shared stem takes the extension, then a hash of
    # the input's path; names depend on the set of inputs, not on their order.
    assert output_names(["a/x.jpg", "b/x.png", "b/y.png", "c/x.tif"]) == \
        ["x_jpg", "x_png", "y", "x_tif"]
    assert output_names(["b/y.png", "c/x.tif", "a/x.jpg"]) == ["y", "x_tif", "x_jpg"]
    twins = output_names(["a/x.jpg", "b/x.jpg"])
    assert twins[0] != twins[1] and all(re.fullmatch(r"x_jpg_[0-9a-f]{8}", t) for t in twins)
    assert output_names(["s3://bucket/dir/photo.jpg"]) == ["photo"]


def test_the_driver_takes_the_inputs_the_cli_takes(images, tmp_path):
    # The awkward cases of the CLI's input rules, through both drivers: a list saved with a BOM
    # and CRLF, a file named twice, a missing file, a FIFO (refused, never opened), an output
    # folder inside the searched tree holding a previous run's outputs.
    root = tmp_path / "in"
    shutil.copytree(images, root)
    os.mkfifo(root / "pipe.png")
    out = root / "labels"
    out.mkdir()
    (out / "old_seg.png").write_bytes((root / "gen_grey.png").read_bytes())
    lst = tmp_path / "list.txt"
    lst.write_bytes(b"\xef\xbb\xbf" + f"{root / 'gen_grey.png'}\r\n# a comment\r\n"
                    f"{root / 'nope.png'}\r\n{root / 'pipe.png'}\r\n".encode())
    args = [f"@{lst}", str(root), str(root / "gen_grey.png")]
    found, failed = _command._list_inputs(args, True, "png,jpg", str(out))
    r = subprocess.run([str(CLI), "-q", "segment", *args, "-r", "--ext", "png,jpg", "-o", str(out),
                        "--model", str(TINY_B), "--save", "labels,json", "--threads", "1"],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    cli_failed = {(e["input"], e["error"]) for e in summary["images"] if e["status"] == "error"
                  and e["error"] in ("not_found", "io_error") or "pipe" in e["input"]}
    assert {(p, code) for p, code, _ in failed} == cli_failed, r.stderr
    assert {(root / "nope.png").as_posix(), (root / "pipe.png").as_posix()} <= \
        {p for p, _ in cli_failed}
    cli_inputs = [e["input"] for e in summary["images"] if (e["input"], e.get("error"))
                  not in cli_failed]
    assert sorted(found) == sorted(cli_inputs)  # the same files (summary.json sorts them)
    assert len(set(found)) == len(found)  # once each
    assert not any("labels" in Path(p).parts for p in found)  # outputs are not inputs
    assert found.count(str(root / "gen_grey.png")) == 1


def test_the_class_alone_records_failures_per_row(images, cli_out):
    seg = SapiensSegmenter(str(TINY_B), device="cpu", threads=1, return_labels=True)
    paths = [str(images / "broken.jpg"), str(images / "small_20x20.png")]
    out = seg({"path": np.array(paths, dtype=object), "id": np.array([7, 8])})
    assert list(out["id"]) == [7, 8]  # other columns are kept
    assert list(out["error_code"]) == ["invalid_input", "invalid_input"]
    assert "truncated" in out["error"][0] or "decode" in out["error"][0]
    # No image succeeded, yet the statistics name every class.
    assert list(out["class_pixels"][0]) == seg.classes and len(seg.classes) == 28
    out = seg({"bytes": np.array([(images / "synth_33x47.png").read_bytes()], dtype=object),
               "path": np.array([str(images / "synth_33x47.png")], dtype=object)})
    check_rows_equal_cli([{k: v[0] for k, v in out.items()}], cli_out)


def test_uris_and_filesystems(images, cli_out, tmp_path):
    import pyarrow.fs as pafs

    # A URI is read through pyarrow.fs; an unreadable one fails its row.
    seg = SapiensSegmenter(str(TINY_B), device="cpu", threads=1, return_labels=False)
    uri = (images / "synth_33x47.png").as_uri()
    out = seg({"path": np.array([uri, uri + ".missing"], dtype=object)})
    assert out["error"][0] is None and out["error_code"][1] == "not_found"
    check_rows_equal_cli([{k: v[0] for k, v in out.items()}], cli_out)

    # With a filesystem object that is not the local one (as for an object store: the PNG is
    # one stream, no rename), inputs and outputs are paths on it.
    shutil.copy(images / "synth_33x47.png", tmp_path / "in.png")
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    seg = SapiensSegmenter(str(TINY_B), device="cpu", threads=1, output="labels/run1",
                           filesystem=fs, return_labels=False)
    out = seg({"path": np.array(["in.png"], dtype=object),
               "name": np.array(["synth_33x47"], dtype=object)})
    assert out["labels_png"][0] == "labels/run1/synth_33x47_seg.png", out["error"][0]
    row = {k: v[0] for k, v in out.items()}
    check_rows_equal_cli([dict(row, labels_png=str(tmp_path / row["labels_png"]))], cli_out,
                         key=lambda row: row["name"] + ".png")


def test_an_actor_runs_on_the_gpu_ray_gave_it(monkeypatch):
    monkeypatch.setattr(_segmenter, "_in_actor", lambda: True)
    monkeypatch.setattr(_segmenter.ray, "get_gpu_ids", lambda: [3])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert _segmenter._actor_device() == "cuda:0"  # Ray narrowed the devices to the one it gave
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert _segmenter._actor_device() == "cuda:1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _segmenter._actor_device() == "cuda:3"  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
    monkeypatch.setattr(_segmenter.ray, "get_gpu_ids", lambda: [])
    assert _segmenter._actor_device() == "cpu"


# ---- on the cluster -----------------------------------------------------------------------------

def test_the_command_on_an_existing_cluster_equals_the_cli(cluster, images, cli_out, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "sapiens_seg.ray", str(images), "-o", str(out), "--model",
         str(TINY_B), "--address", cluster, "--batch-size", "2", "--concurrency", "2",
         "--threads", "1", "--quiet"],
        capture_output=True, text=True, timeout=300,
        env=clean_env(PYTHONPATH=os.environ["PYTHONPATH"]))
    assert r.returncode == 17, r.stdout + r.stderr  # as the CLI: the first failure's code
    assert "7 segmented, 2 failed" in r.stdout
    cli_dir, by_name = cli_out
    # The same label files (names included: gen_noise.jpg and gen_noise.png -> gen_noise_jpg,
    # gen_noise_png), same pixels.
    assert sorted(p.name for p in out.glob("*_seg.png")) == \
        sorted(p.name for p in cli_dir.glob("*_seg.png"))
    for p in cli_dir.glob("*_seg.png"):
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name  # the CLI's bytes
    summary = json.loads((out / "summary.json").read_text())
    assert [Path(e["input"]).name for e in summary["images"]] == \
        sorted(p.name for p in images.iterdir())  # input order, whatever finished first
    for e in summary["images"]:
        ref = by_name[Path(e["input"]).name]
        assert e["status"] == ref["status"], e
        if e["status"] == "ok":
            assert e["classes"] == ref["classes"] and (e["height"], e["width"]) == \
                (ref["height"], ref["width"])
        else:
            assert e["error"] == ref["error"] and e["message"]
    import pyarrow.parquet as pq
    table = pq.read_table(out / "summary.parquet")
    assert table.num_rows == len(by_name)
    assert sorted(n for n, c in zip(table["input"].to_pylist(), table["error_code"].to_pylist())
                  if c) == sorted(str(images / n) for n in BAD)


def test_binary_files_and_read_images_equal_the_cli(cluster, images, cli_out, tmp_path):
    # Encoded bytes: decoded by the library (JPEG included) exactly as the CLI decodes files.
    # Named by stem (no 'name' column), so one of the two gen_noise files is left out and the
    # other's PNG is gen_noise_seg.png (the CLI, seeing both, says gen_noise_jpg_seg.png).
    out = tmp_path / "labels"
    paths = sorted(str(p) for p in images.iterdir() if p.name != "gen_noise.png")
    ds = ray.data.read_binary_files(paths, include_paths=True)
    rows = segment_dataset(ds, str(TINY_B), batch_size=3, concurrency=1, device="cpu",
                           output=str(out)).take_all()
    names = check_rows_equal_cli(rows, cli_out,
                                 png_names={Path(p).name: f"{Path(p).stem}_seg.png" for p in paths})
    assert sorted(names) == sorted(Path(p).name for p in paths)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{Path(n).stem}_seg.png" for n in names if n not in BAD)

    # Ray's own image reader (PIL): identical pixels for the PNGs, so identical labels.
    pngs = sorted(str(p) for p in images.glob("*.png") if p.name not in BAD)
    ds = ray.data.read_images(pngs, mode="RGB", include_paths=True)
    rows = segment_dataset(ds, str(TINY_B), batch_size=2, concurrency=1).take_all()
    assert {row["path"] for row in rows} == set(pngs)
    check_rows_equal_cli(rows, cli_out)
    assert all(row["labels_png"] is None for row in rows)


class CrashOnce(SapiensSegmenter):
    """Exits the actor's process (as a crash or an OOM kill would) right after its second batch
    was written, once per run: the first actor to take the marker file dies."""

    def __init__(self, model, *, marker: str, **kw):
        super().__init__(model, **kw)
        self.marker = marker
        self.calls = 0
        with open(marker + ".inits", "a") as f:
            f.write(f"{os.getpid()}\n")

    def __call__(self, batch):
        out = super().__call__(batch)
        self.calls += 1
        if self.calls == 2:
            try:
                os.rename(self.marker, self.marker + ".taken")  # atomic: one taker
            except FileNotFoundError:
                return out
            os._exit(1)
        return out


def test_a_killed_actor_mid_run_still_gives_complete_correct_output(cluster, images, cli_out,
                                                                     tmp_path):
    marker = tmp_path / "crash"
    marker.write_text("")
    out = tmp_path / "labels"
    paths = sorted(str(p) for p in images.iterdir())
    # A 'name' column (the CLI's names, as the command passes them) names the outputs.
    ds = ray.data.from_items([{"path": p, "name": n} for p, n in zip(paths, output_names(paths))])
    result = segment_dataset(ds, str(TINY_B), batch_size=2, concurrency=1, device="cpu",
                             output=str(out), segmenter_cls=CrashOnce, marker=str(marker))
    rows = result.take_all()
    assert not marker.exists() and Path(str(marker) + ".taken").exists(), "no actor crashed"
    pids = Path(str(marker) + ".inits").read_text().split()
    assert len(set(pids)) >= 2, "the crashed actor was not replaced"
    names = check_rows_equal_cli(rows, cli_out)
    assert sorted(names) == sorted(p.name for p in images.iterdir())  # all, once each
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]  # no partial file left


class WithEnv(SapiensSegmenter):
    """Sets the weight-store variables in the actor's process before it loads the model."""

    def __init__(self, model, *, env: dict, log: str, **kw):
        os.environ.update(env)
        t0 = time.time()
        super().__init__(model, **kw)
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {t0} {time.time()} {self.device} {self.threads}\n")


def test_actors_on_one_node_download_the_weights_once(cluster, images, tmp_path):
    payload = TINY_B.read_bytes()
    card = json.loads((FIXTURES / "cards" / "tiny_b.json").read_text())
    card.update(id="ray-tiny-b", repo="test/tiny-b", revision="r1", path_in_repo=TINY_B.name,
                size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / "ray-tiny-b.json").write_text(json.dumps(card))
    hub = HubServer({TINY_B.name: payload})
    hub.slow_delay = 0.05  # a transfer of about 4 s: both actors start while it runs
    try:
        env = {"SAPIENS_SEG_HOME": str(tmp_path / "home"),
               "SAPIENS_SEG_CARDS": str(tmp_path / "cards"),
               "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_ENDPOINT": hub.endpoint("slow")}
        ds = ray.data.from_items([{"path": str(images / n)} for n in
                                  ("synth_33x47.png", "gen_grey.png", "gen_noise.png",
                                   "synth_300x211.png")])
        rows = segment_dataset(ds, "ray-tiny-b", batch_size=1, concurrency=2,
                               segmenter_cls=WithEnv, env=env, log=str(tmp_path / "loads"),
                               return_labels=False).take_all()
    finally:
        hub.close()
    assert [row["error"] for row in rows] == [None] * 4
    loads = [line.split() for line in (tmp_path / "loads").read_text().splitlines()]
    assert len({pid for pid, *_ in loads}) == 2, loads
    # No GPU given: the CPU, with as many threads as CPUs reserved for the actor (1).
    assert {(device, threads) for *_, device, threads in loads} == {("cpu", "1")}
    assert len(hub.gets(TINY_B.name)) == 1  # two actors, one transfer
    assert (tmp_path / "home" / "weights" / TINY_B.name).read_bytes() == payload


# The driver's pre-check applies the library's card lookup and licence gate, not copies of them:
# SAPIENS_SEG_NONCOMMERCIAL=true (which the library accepts, as 1, yes and on) and a model id with
# an @revision (which the library resolves) used to be refused by the driver alone. Offline, a
# model that passes the pre-check stops at the weights' download with the offline code (14), so
# no cluster starts.
@pytest.mark.parametrize("model,env,code,says", [
    ("sapiens-seg-0.3b-goliath", {"SAPIENS_SEG_NONCOMMERCIAL": "true"}, 14, "offline"),
    ("sapiens-seg-0.3b-goliath", {"SAPIENS_SEG_NONCOMMERCIAL": "0"}, 15, "non-commercial"),
    ("sapiens-seg-0.3b-goliath@5c3ea7a0", {"SAPIENS_SEG_NONCOMMERCIAL": "yes"}, 14, "offline"),
    ("sapiens-seg-0.3b-goliath@deadbeef", {"SAPIENS_SEG_NONCOMMERCIAL": "1"}, 11,
     "has revision"),
])
def test_the_driver_applies_the_librarys_card_and_licence_rules(model, env, code, says, tmp_path):
    pythonpath = os.pathsep.join(p for p in (str(PKG_PARENT), os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run(
        [sys.executable, "-m", "sapiens_seg.ray", str(REPO / "examples" / "astronaut.jpg"), "-o",
         str(tmp_path / "out"), "--model", model],
        capture_output=True, text=True, timeout=300,
        env=clean_env(PYTHONPATH=pythonpath, SAPIENS_SEG_OFFLINE="1",
                      SAPIENS_SEG_HOME=str(tmp_path / "home"), **env))
    assert r.returncode == code, r.stderr
    assert says in r.stderr, r.stderr
