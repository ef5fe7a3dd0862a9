"""Runs inside the clean root file system of tools/packaging/check_wheel.sh, with the venv's
Python into which the repaired wheel and the pinned torch were installed (and nothing else).

    python check_wheel_chroot.py DIR   # DIR: what check_wheel.sh copied in; writes DIR/result.json

Uses the package from Python and its sapiens-seg CLI (an image, videos, a download through the
loopback stand-in for the Hub of tests/python/hub_server.py), then checks where every shared
library of those processes came from: each must be a file of the venv (the wheel, torch and its
pip dependencies) or of a Debian package of this root, and the libraries the wheel vendors
(OpenCV, FFmpeg, libcurl, OpenSSL, the image codecs, ISA-L, zlib) must be the wheel's copies.
Any failed check raises, and the exit status is then 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

WORK = Path(sys.argv[1])
VENV = Path(sys.prefix).resolve()
SITE = Path(next(p for p in sys.path if p.endswith("site-packages"))).resolve()
TINY_A = WORK / "fixtures" / "tiny_a_torchscript.pt2"
TINY_B = WORK / "fixtures" / "tiny_b_torchscript.pt2"
PHOTO = WORK / "astronaut.jpg"
CLI = VENV / "bin" / "sapiens-seg"
# Libraries that must come from the wheel (sapiens_seg.libs/) wherever our binaries need them:
# the product's own dependencies beyond the manylinux policy and torch.
VENDORED = re.compile(r"lib(opencv_|av(codec|format|util)|swscale|x264|dav1d|curl|ssl|crypto|"
                      r"jpeg|png|tiff|webp|sharpyuv|isal|stb|jbig|lzma|zstd|deflate|Lerc)")
# What the manylinux_2_35 policy lets a wheel take from the system (glibc's libraries, libstdc++,
# libgcc_s, zlib, ...); every other library of ours must resolve into the venv.
POLICY = re.compile(r"^(ld-linux-x86-64|libc|libm|libmvec|libdl|librt|libpthread|libanl|libnsl|"
                    r"libutil|libresolv|libstdc\+\+|libgcc_s|libatomic|libz|libexpat)\.so")
result: dict = {"python": sys.version.split()[0], "steps": []}


def step(name: str, **facts) -> None:
    result["steps"].append({"step": name, **facts})
    print(f"[chroot] {name}: {json.dumps(facts)}", flush=True)


SHARED_OBJECT = re.compile(r"\.so(\.[0-9]+)*$")


def mapped_libraries(pid: int | str = "self") -> set[str]:
    """The shared objects mapped into a process (its files named *.so or *.so.N...)."""
    with open(f"/proc/{pid}/maps") as f:
        paths = {fields[5].strip() for fields in (line.split(maxsplit=5) for line in f)
                 if len(fields) == 6 and fields[5].startswith("/")}
    return {p for p in paths if SHARED_OBJECT.search(p)}


def debian_owner(path: str) -> str | None:
    """The Debian package of this root that installed `path` (usr-merged names tried both ways)."""
    candidates = {path, os.path.realpath(path)}
    for p in list(candidates):
        candidates.add(p[4:] if p.startswith("/usr/") else "/usr" + p)
    for p in candidates:
        r = subprocess.run(["dpkg-query", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":", 1)[0]
    return None


def where(path: str) -> str:
    real = Path(path).resolve()
    if real.is_relative_to(SITE):
        return "venv:" + str(real.relative_to(SITE)).split("/", 1)[0]
    owner = debian_owner(path)
    assert owner, f"{path} is neither in the venv nor a file of a Debian package of this root"
    return "debian:" + owner


def check_libraries(libs: set[str], what: str) -> dict:
    origin = {p: where(p) for p in sorted(libs)}
    ours = {p: o for p, o in origin.items() if o.startswith("venv:sapiens_seg")}
    assert any("libsapiens_seg" in p for p in ours), f"{what}: libsapiens_seg is not loaded"
    from_system = [p for p, o in origin.items()
                   if o.startswith("debian:") and VENDORED.match(os.path.basename(p))]
    # Python's own modules may load the root's zlib or OpenSSL (python3's dependencies); the
    # wheel's binaries must still use their own copies, so those must be loaded too.
    for p in from_system:
        name = os.path.basename(p).split(".so")[0]
        assert name in ("libssl", "libcrypto", "liblzma", "libzstd"), \
            f"{what}: {p} ({origin[p]}) came from the system, not from the wheel"
        assert any(os.path.basename(q).startswith(name + "-") for q in ours), \
            f"{what}: {p} is loaded from the system and the wheel's {name} is not"
    by_origin: dict[str, int] = {}
    for o in origin.values():
        key = o if o.startswith("debian:") else o.split("/")[0]
        by_origin[key] = by_origin.get(key, 0) + 1
    return {"libraries": len(origin), "by_origin": by_origin,
            "vendored_loaded": sorted(os.path.basename(p) for p in ours
                                      if "/sapiens_seg.libs/" in p),
            "python_loaded_from_debian": sorted(os.path.basename(p) for p in from_system)}


def ldd(binary: Path) -> dict:
    r = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    resolved = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m:
            assert m.group(2) != "not", f"ldd {binary}: {line.strip()}"
            resolved[m.group(1)] = m.group(2)
    for name, path in resolved.items():
        real = Path(path).resolve()
        if real.is_relative_to(SITE):
            continue
        assert POLICY.match(name), f"ldd {binary}: {name} => {path}, outside the venv"
    wheel_libs = sorted(n for n, p in resolved.items() if "/sapiens_seg.libs/" in p)
    torch_libs = sorted(n for n, p in resolved.items() if "/torch/lib/" in p)
    return {"binary": str(binary.relative_to(SITE)) if binary.is_relative_to(SITE) else
            str(binary), "needs": len(resolved), "from_wheel": len(wheel_libs),
            "from_torch": torch_libs,
            "from_system": sorted(n for n, p in resolved.items()
                                  if not Path(p).resolve().is_relative_to(SITE))}


def run_cli(*args, env=None, timeout=600) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Runs the CLI and samples /proc/PID/maps while it runs (libraries are mapped at start)."""
    p = subprocess.Popen([str(CLI), *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        try:
            # The console script is Python until it execs the binary: only the binary counts.
            if os.readlink(f"/proc/{p.pid}/exe").endswith("/sapiens_seg/bin/sapiens-seg"):
                seen |= mapped_libraries(p.pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.02)
    out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert r.returncode == 0, f"sapiens-seg {' '.join(map(str, args))}: {r.returncode}\n{err}"
    assert seen, f"sapiens-seg {' '.join(map(str, args))}: the binary's maps were never read"
    return r, seen


def https_server(root: Path, cert: Path, key: Path):
    """A static HTTPS file server on loopback, serving `root`, in a thread."""
    import functools
    import ssl
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main() -> None:
    t0 = time.monotonic()
    import sapiens_seg
    import torch
    from sapiens_seg import segmentation

    assert Path(sapiens_seg.__file__).resolve().is_relative_to(SITE), sapiens_seg.__file__
    result.update(sapiens_seg=sapiens_seg.__version__, torch=torch.__version__)

    # ---- Python: an image -----------------------------------------------------------------
    model = segmentation.load(str(TINY_A), mode="portable", device="cpu")
    r = model(str(PHOTO))
    assert r.labels.shape == (r.height, r.width) == (512, 512), r.labels.shape
    assert len(r.classes) == 28 and int(r.foreground.sum()) > 0
    step("python segment", image=PHOTO.name, size=[r.width, r.height],
         foreground_pixels=int(r.foreground.sum()), backend=str(r.backend))

    # ---- Python: a download through the loopback hub ----------------------------------------
    sys.path.insert(0, str(WORK))
    from hub_server import HubServer

    payload = TINY_B.read_bytes()
    card = json.loads((WORK / "fixtures" / "cards" / "tiny_b.json").read_text())
    card.update(id="wheel-tiny-b", repo="test/tiny-b", revision="r1",
                path_in_repo=TINY_B.name, size=len(payload),
                sha256=hashlib.sha256(payload).hexdigest())
    cards = WORK / "cards"
    cards.mkdir(exist_ok=True)
    (cards / "wheel-tiny-b.json").write_text(json.dumps(card))
    hub = HubServer({TINY_B.name: payload})
    try:
        os.environ.update(SAPIENS_SEG_HOME=str(WORK / "home-py"), SAPIENS_SEG_CARDS=str(cards),
                          HF_HUB_CACHE=str(WORK / "hf"), HF_ENDPOINT=hub.endpoint("ok"),
                          SAPIENS_SEG_RETRY_BASE_MS="50")
        path = segmentation.download("wheel-tiny-b")
        assert Path(path).read_bytes() == payload, path
        m2 = segmentation.load("wheel-tiny-b", mode="portable", device="cpu")
        assert m2(str(PHOTO)).labels.shape == (512, 512)
        assert len(hub.gets(TINY_B.name)) == 1
        step("python download", server="tests/python/hub_server.py (loopback)",
             bytes=len(payload), sha256_checked=True)

        # ---- CLI: the same download (a fresh home), then the image and the videos ----------
        env = dict(os.environ, SAPIENS_SEG_HOME=str(WORK / "home-cli"),
                   HF_ENDPOINT=hub.endpoint("drop"))
        r, _ = run_cli("models", "download", "wheel-tiny-b", env=env)
        assert Path(r.stdout.strip()).read_bytes() == payload
        gets = hub.gets(TINY_B.name)
        assert len(gets) == 3 and gets[2].range, [g.range for g in gets]  # cut off, then resumed
        step("cli models download", resumed_after_a_dropped_connection=True)
    finally:
        hub.close()
    # The Python process's libraries, before the HTTPS server below loads Python's own ssl.
    result["maps_python"] = check_libraries(mapped_libraries(), "python process")

    # ---- CLI: HTTPS, verified against a certificate made for this run ----------------------
    # The vendored libcurl has no CA bundle path compiled in: OpenSSL's default locations, which
    # SSL_CERT_FILE overrides. Without it, the self-signed server must be refused.
    tls = WORK / "tls"
    served = WORK / "https-root" / "test" / "tiny-b" / "resolve" / "r1"
    served.mkdir(parents=True)
    (served / TINY_B.name).write_bytes(payload)
    srv = https_server(served.parents[3], tls / "cert.pem", tls / "key.pem")
    try:
        env = dict(os.environ, SAPIENS_SEG_HOME=str(WORK / "home-tls"),
                   HF_ENDPOINT=f"https://127.0.0.1:{srv.server_address[1]}")
        env.pop("SSL_CERT_FILE", None)
        refused = subprocess.run([str(CLI), "models", "download", "wheel-tiny-b"], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "certificate" in refused.stderr.lower(), refused
        r, _ = run_cli("models", "download", "wheel-tiny-b",
                       env=dict(env, SSL_CERT_FILE=str(tls / "cert.pem")))
        assert Path(r.stdout.strip()).read_bytes() == payload
        step("cli models download https", unknown_certificate_refused=True,
             ssl_cert_file_accepted=True)
    finally:
        srv.shutdown()

    out = WORK / "out"
    r, cli_maps = run_cli("segment", PHOTO, "-o", out, "--model", TINY_A, "--mode", "portable",
                          "--device", "cpu", "--quiet")
    assert (out / "astronaut_seg.png").stat().st_size > 0
    step("cli segment image", outputs=sorted(p.name for p in out.iterdir()))
    videos = []
    for video in sorted((WORK / "videos").iterdir()):
        r, seen = run_cli("segment", video, "-o", out, "--model", TINY_A, "--mode", "portable",
                          "--device", "cpu", "--save", "overlay,labels,json", "--json")
        cli_maps |= seen
        line = json.loads(r.stdout.splitlines()[-1])
        overlay = Path(line["outputs"]["overlay_video"])
        frames = sorted((out / f"{video.stem}_frames").glob("*_seg.png"))
        assert overlay.stat().st_size > 0 and frames, line
        assert line["codec"] == "h264" and "codec_fallback" not in line, line
        videos.append({"input": video.name, "overlay": overlay.name, "codec": line["codec"],
                       "label_frames": len(frames)})
    step("cli segment videos", videos=videos)

    # ---- where the libraries came from ------------------------------------------------------
    result["maps_cli"] = check_libraries(cli_maps, "sapiens-seg process")
    pkg = SITE / "sapiens_seg"
    result["ldd"] = [ldd(b) for b in [*pkg.glob("_core*.so"), *pkg.glob("lib/*.so*"),
                                      pkg / "bin" / "sapiens-seg"]]
    step("libraries", python=result["maps_python"]["by_origin"],
         cli=result["maps_cli"]["by_origin"])
    result["segmented"] = True
    result["seconds"] = round(time.monotonic() - t0, 1)
    (WORK / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
