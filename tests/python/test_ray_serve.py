"""sapiens_seg.serve on a local Ray cluster: every endpoint of the serving contract, every output
format, the errors, batched answers equal to single ones, and label PNG (and .npy) bytes equal
to the CLI's files for the same images and model (and to the C++ server's, when this build's
`sapiens-seg` has the `serve` command).

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES), or by hand:

    SAPIENS_SEG_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/python/test_ray_serve.py

The module starts a 2-CPU Ray cluster (no dashboard) and Serve's HTTP proxy on a free port of
127.0.0.1, and shuts both down at its end; every request has a timeout.
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from conftest import CLI, FIXTURES, PKG_PARENT, use_built_package

TINY_B = FIXTURES / "tiny_b_torchscript.pt2"
IMAGES = ("astronaut.jpg", "synth_300x211.png", "synth_landscape_480x640.png")
TIMEOUT = 120  # seconds, per request

ray = pytest.importorskip("ray", reason="Ray is not installed (tools/setup.sh installs ray[serve])")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed (ray[serve])")
use_built_package()
if not TINY_B.exists() or not CLI.exists():
    pytest.skip(f"no fixtures in {FIXTURES} or no CLI at {CLI}", allow_module_level=True)

import cv2  # noqa: E402
coco_mask = pytest.importorskip("pycocotools.mask", reason="pycocotools is not installed")
from ray import serve  # noqa: E402

from sapiens_seg import segmentation  # noqa: E402
from sapiens_seg.serve import build_app  # noqa: E402

# Ray's own deprecation notices are not this project's concern.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MAX_BODY = 4 << 20  # the test deployment's body limit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}


class Client:
    def __init__(self, port: int) -> None:
        self.port = port

    def __call__(self, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        try:
            try:
                c.request(method, path, body=body, headers=headers or {})
            except (BrokenPipeError, ConnectionResetError):
                pass  # a server may answer (413) and close before the whole body is sent
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def segment(self, image: bytes, query: str = "", content_type: str = "image/jpeg"):
        return self("POST", "/v1/segment" + query, image, {"Content-Type": content_type})


def error_of(status: int, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    assert headers["content-type"].startswith("application/json"), (status, body)
    doc = json.loads(body)
    assert set(doc) == {"error"} and isinstance(doc["error"]["message"], str), doc
    return status, doc["error"]["code"]


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("images")
    for name in IMAGES:
        shutil.copy(FIXTURES / "images" / name, d / name)
    return d


@pytest.fixture(scope="module")
def cli_out(images, tmp_path_factory) -> Path:
    """The CLI's label PNGs, .npy files and overlays for the same images and model."""
    out = tmp_path_factory.mktemp("cli")
    r = subprocess.run([str(CLI), "-q", "segment", str(images), "-o", str(out), "--model",
                        str(TINY_B), "--save", "labels,npy,overlay", "--threads", "1"],
                       capture_output=True, text=True, env=clean_env(), timeout=600)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def server():
    """The deployment on a local 2-CPU cluster, Serve's proxy on a free loopback port."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_USAGE_STATS_ENABLED")}
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PKG_PARENT), saved["PYTHONPATH"]) if p)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app([str(TINY_B)], mode="portable", device="cpu", max_batch=4,
                            max_delay_ms=200, max_body_bytes=MAX_BODY, cpus_per_replica=1),
                  name="sapiens-seg", route_prefix="/")
        yield Client(port)
    finally:
        serve.shutdown()
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stem(name: str) -> str:
    return name.rsplit(".", 1)[0]


# ---- probes and models ------------------------------------------------------------------------

def test_probes_and_models(server):
    for path, doc in (("/health", {"status": "ok"}), ("/ready", {"status": "ready"})):
        status, headers, body = server("GET", path)
        assert status == 200 and headers["content-type"].startswith("application/json")
        assert json.loads(body) == doc
    status, _, body = server("GET", "/v1/models")
    assert status == 200
    (m,) = json.loads(body)["models"]
    assert m["id"] == TINY_B.name and m["family"] == "sapiens-v1"
    assert len(m["classes"]) == 28 and m["classes"][0] == "Background"
    assert len(m["palette"]) == 28 and all(len(c) == 3 for c in m["palette"])
    assert m["input_size"] == [1024, 768]
    assert (m["device"], m["dtype"], m["mode"]) == ("cpu", "float32", "portable")
    assert m["max_batch"] == 4 and m["max_delay_ms"] == 200 and m["max_queue"] >= 1


def test_unknown_path_and_wrong_method(server):
    assert error_of(*server("GET", "/v2/nothing")) == (404, "not_found")
    status, headers, body = server("GET", "/v1/segment")
    assert error_of(status, headers, body) == (405, "invalid_input")
    assert headers["allow"] == "POST"


# ---- outputs ----------------------------------------------------------------------------------

def test_label_png_is_the_clis(server, images, cli_out):
    for name in IMAGES:
        data = (images / name).read_bytes()
        status, headers, body = server.segment(data, content_type="application/octet-stream")
        assert status == 200 and headers["content-type"] == "image/png"
        assert body == (cli_out / f"{stem(name)}_seg.png").read_bytes(), name


def test_multipart_and_base64_json_carry_the_same_image(server, images, cli_out):
    data = (images / "astronaut.jpg").read_bytes()
    want = (cli_out / "astronaut_seg.png").read_bytes()
    b = uuid.uuid4().hex
    body = (f"--{b}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi\r\n--{b}\r\n"
            f"Content-Disposition: form-data; name=\"image\"; filename=\"a.jpg\"\r\n"
            f"Content-Type: image/jpeg\r\n\r\n").encode() + data + f"\r\n--{b}--\r\n".encode()
    status, _, got = server.segment(body, content_type=f"multipart/form-data; boundary={b}")
    assert status == 200 and got == want
    doc = {"image": base64.b64encode(data).decode(), "output": "png"}
    status, _, got = server.segment(json.dumps(doc).encode(), "?output=json",
                                    content_type="application/json")
    assert status == 200 and got == want  # the JSON's fields override the query


def test_npy_is_the_clis(server, images, cli_out):
    data = (images / "synth_300x211.png").read_bytes()
    status, headers, body = server.segment(data, "?output=npy", "image/png")
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    assert "labels.npy" in headers["content-disposition"]
    assert body == (cli_out / "synth_300x211_seg.npy").read_bytes()


def test_overlay_pixels_are_the_clis(server, images, cli_out):
    data = (images / "astronaut.jpg").read_bytes()
    status, headers, body = server.segment(data, "?output=overlay&opacity=0.5")
    assert status == 200 and headers["content-type"] == "image/png"
    got = cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_UNCHANGED)
    want = cv2.imread(str(cli_out / "astronaut_overlay.png"), cv2.IMREAD_UNCHANGED)
    assert got is not None and got.shape == want.shape and (got == want).all()
    # Only the named classes are coloured; the rest is the photo as decoded.
    labels = cv2.imread(str(cli_out / "astronaut_seg.png"), cv2.IMREAD_UNCHANGED)
    present = np.unique(labels)
    k = int(present[-1])
    status, _, body = server.segment(data, f"?output=overlay&classes={k}&opacity=1")
    one = cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_UNCHANGED)
    photo = segmentation.read_image(data)[:, :, ::-1]  # as the library decodes it, BGR
    assert status == 200 and (one[labels != k] == photo[labels != k]).all()
    assert (one[labels == k] == want[labels == k]).any()


def test_json_summary(server, images, cli_out):
    data = (images / "astronaut.jpg").read_bytes()
    labels = cv2.imread(str(cli_out / "astronaut_seg.png"), cv2.IMREAD_UNCHANGED)
    h, w = labels.shape
    status, headers, body = server.segment(data, "?output=json&rle=true")
    assert status == 200 and headers["content-type"].startswith("application/json")
    doc = json.loads(body)
    assert doc["model"] == TINY_B.name and (doc["width"], doc["height"]) == (w, h)
    assert doc["backend"] == {"mode": "portable", "device": "cpu", "dtype": "float32"}
    assert set(doc["timings_ms"]) >= {"decode", "preprocess", "network", "postprocess", "total",
                                      "queue"}
    counts = np.bincount(labels.ravel(), minlength=28)
    assert [c["index"] for c in doc["classes"]] == [int(k) for k in np.flatnonzero(counts)]
    for c in doc["classes"]:
        mask = labels == c["index"]
        ys, xs = np.nonzero(mask)
        assert c["pixels"] == counts[c["index"]] and c["fraction"] == pytest.approx(
            counts[c["index"]] / (h * w))
        assert c["bbox"] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
        rle = {"size": c["rle"]["size"], "counts": c["rle"]["counts"].encode()}
        assert c["rle"]["size"] == [h, w] and (coco_mask.decode(rle).astype(bool) == mask).all()
    # classes= narrows the report (by name or index); without rle= there is none.
    names = [doc["classes"][0]["name"], str(doc["classes"][-1]["index"])]
    status, _, body = server.segment(data, "?output=json&classes=" + ",".join(names))
    narrowed = json.loads(body)
    assert status == 200
    assert [c["index"] for c in narrowed["classes"]] == [doc["classes"][0]["index"],
                                                          doc["classes"][-1]["index"]]
    assert all("rle" not in c for c in narrowed["classes"])


# ---- errors -----------------------------------------------------------------------------------

def error_cases(images) -> list[tuple[tuple, tuple[int, str]]]:
    """(segment() arguments, expected (status, code)) of bad requests."""
    data = (images / "astronaut.jpg").read_bytes()
    small = cv2.imencode(".png", np.full((20, 20, 3), 128, np.uint8))[1].tobytes()
    return [
        ((data[:3000],), (422, "invalid_input")),                       # truncated JPEG
        ((b"not an image at all",), (415, "invalid_input")),            # no image format
        ((b"\x89PNG\r\n\x1a\n" + b"\0" * 8,), (400, "invalid_input")),  # PNG, broken header
        ((small, "", "image/png"), (400, "invalid_input")),             # 20x20: too small
        ((data, "", "text/plain"), (415, "invalid_input")),
        ((data, "?model=nope"), (404, "not_found")),
        ((data, "?output=tiff"), (400, "invalid_input")),
        ((data, "?output=json&classes=Tail"), (400, "invalid_input")),
        ((data, "?output=overlay&opacity=2"), (400, "invalid_input")),
        ((data, "?rle=maybe"), (400, "invalid_input")),
        ((b"",), (400, "invalid_input")),
        ((b'{"image": "***"}', "", "application/json"), (400, "invalid_input")),
        ((b"[1, 2", "", "application/json"), (400, "invalid_input")),
        ((b"--x\r\n\r\n--x--\r\n", "", "multipart/form-data; boundary=x"),
         (400, "invalid_input")),
        ((b"\0" * (MAX_BODY + 1),), (413, "invalid_input")),
    ]


def test_errors(server, images):
    cases = error_cases(images)
    got = [error_of(*server.segment(*args)) for args, _ in cases]
    assert got == [want for _, want in cases]
    assert server("GET", "/health")[0] == 200  # still serving


# ---- batching ---------------------------------------------------------------------------------

def test_concurrent_requests_are_batched_with_the_same_answers(server, images, cli_out):
    jobs = [IMAGES[i % len(IMAGES)] for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(
            lambda n: server.segment((images / n).read_bytes(), content_type="image/*"), jobs))
    for name, (status, _, body) in zip(jobs, answers):
        assert status == 200 and body == (cli_out / f"{stem(name)}_seg.png").read_bytes(), name
    status, _, text = server("GET", "/metrics")
    assert status == 200
    sizes = {}
    for line in text.decode().splitlines():
        if line.startswith("sapiens_seg_batch_size_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            sizes[le] = int(line.rsplit(" ", 1)[1])
    assert sizes["+Inf"] > sizes["1"], f"no batch of more than one image: {sizes}"
    for name in ("sapiens_seg_requests_total", "sapiens_seg_rejections_total",
                 "sapiens_seg_queue_wait_seconds_bucket", "sapiens_seg_inference_seconds_sum",
                 "sapiens_seg_queue_depth", "sapiens_seg_in_flight_requests"):
        assert name in text.decode(), name


# ---- against the C++ server -------------------------------------------------------------------

def cpp_serve_available() -> str | None:
    """None when this build's CLI has `serve`, else why not."""
    r = subprocess.run([str(CLI), "serve", "--help"], capture_output=True, text=True,
                       env=clean_env(), timeout=60)
    return None if r.returncode == 0 else f"{CLI} has no serve command ({r.stderr.strip()[:120]})"


def test_label_png_is_the_cpp_servers(server, images):
    why = cpp_serve_available()
    if why:
        pytest.skip(why)
    port = free_port()
    proc = subprocess.Popen([str(CLI), "serve", "--model", str(TINY_B), "--host", "127.0.0.1",
                             "--port", str(port), "--threads", "1", "--max-body-bytes",
                             str(MAX_BODY)], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        cpp = Client(port)
        deadline = time.monotonic() + 120
        while True:
            try:
                if cpp("GET", "/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the C++ server is not up"
            time.sleep(0.2)
        for name in IMAGES:
            data = (images / name).read_bytes()
            for query in ("", "?output=npy", "?output=overlay&opacity=0.7&classes=1,Face_Neck"):
                ours, theirs = server.segment(data, query), cpp.segment(data, query)
                assert ours[0] == theirs[0] == 200 and ours[2] == theirs[2], (name, query)
                assert ours[1]["content-type"] == theirs[1]["content-type"]
            # The summaries differ only in their timings.
            ours, theirs = (json.loads(c.segment(data, "?output=json&rle=true")[2])
                            for c in (server, cpp))
            assert ours.pop("timings_ms").keys() == theirs.pop("timings_ms").keys()
            assert ours == theirs, name
        for args, _ in error_cases(images):
            assert error_of(*server.segment(*args)) == error_of(*cpp.segment(*args)), args[1:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- configuration ----------------------------------------------------------------------------

def test_app_builder_takes_serve_run_strings_and_the_library_options():
    from sapiens_seg.serve import __main__ as command
    from sapiens_seg.serve import app_builder

    app = app_builder({"model": str(TINY_B), "replicas": "2", "max_batch": "3",
                       "gpus_per_replica": "0", "mode": "portable", "threads": "1",
                       "accept_noncommercial": "true"})
    assert app is not None
    with pytest.raises(TypeError, match="unknown argument 'nope'"):
        app_builder({"model": str(TINY_B), "nope": "1"})
    with pytest.raises(TypeError, match="unexpected option"):
        build_app([str(TINY_B)], batch=4)
    with pytest.raises(ValueError, match="max_batch"):
        build_app([str(TINY_B)], max_batch=0)
    # Every load and segment option of the library is a flag, with the CLI's name and default.
    args = command._parser().parse_args(["--model", "m.pt2"])
    for spec in segmentation.OPTION_SPECS:
        if spec["group"] != "run":
            assert getattr(args, spec["name"]) == segmentation.option_default(spec["name"])
