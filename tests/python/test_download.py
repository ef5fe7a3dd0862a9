"""The weight store end to end through the CLI, against a loopback stand-in for the Hub.

Never touches the internet: HF_ENDPOINT points at tests/python/hub_server.py on 127.0.0.1."""

import hashlib
import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hub_server import HubServer  # noqa: E402
from ptyrun import run_with_tty_stderr  # noqa: E402

from conftest import FIXTURES, CLI
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "astronaut.jpg"
FILE = "tiny_b_torchscript.pt2"
ID = "dl-tiny-b"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")


@pytest.fixture(scope="module")
def payload():
    return (FIXTURES / FILE).read_bytes()


@pytest.fixture()
def hub(payload):
    server = HubServer({FILE: payload})
    yield server
    server.close()


def write_card(folder: Path, payload: bytes, **changes) -> None:
    card = json.loads((FIXTURES / "cards" / "tiny_b.json").read_text())
    card.update(id=ID, repo="test/tiny-b", revision="r1", path_in_repo=FILE,
                size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    card.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{card['id']}.json").write_text(json.dumps(card))


@pytest.fixture()
def env(tmp_path, payload):
    write_card(tmp_path / "cards", payload)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    base.update(SAPIENS_SEG_HOME=str(tmp_path / "home"), SAPIENS_SEG_CARDS=str(tmp_path / "cards"),
                HF_HUB_CACHE=str(tmp_path / "hf"), SAPIENS_SEG_RETRY_BASE_MS="50")
    return base


def target(env) -> Path:
    return Path(env["SAPIENS_SEG_HOME"]) / "weights" / FILE


def cli(env, *args, mode=None, hub=None, **kw):
    e = dict(env)
    if hub is not None:
        e["HF_ENDPOINT"] = hub.endpoint(mode)
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, env=e,
                          timeout=120, **kw)


def start(env, *args, mode, hub, **kw):
    e = dict(env, HF_ENDPOINT=hub.endpoint(mode))
    return subprocess.Popen([str(CLI), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=e, **kw)


def wait_for_part(env, at_least: int, proc) -> int:
    part = Path(str(target(env)) + ".part")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if part.exists() and part.stat().st_size >= at_least:
            return part.stat().st_size
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError("the download did not start")


def test_full_download_then_verify_path_and_rm(env, hub, payload):
    r = cli(env, "models", "download", ID, mode="ok", hub=hub)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(target(env))
    assert target(env).read_bytes() == payload
    assert not Path(str(target(env)) + ".part").exists()
    gets = hub.gets(FILE)
    assert len(gets) == 1 and gets[0].range is None and gets[0].sent == len(payload)
    assert gets[0].user_agent.startswith("sapiens-seg/0.1.0 ")
    # Present now: no second transfer, path and verify agree, the model loads by id.
    assert cli(env, "models", "download", ID, mode="ok", hub=hub).returncode == 0
    assert len(hub.gets(FILE)) == 1
    r = cli(env, "models", "path", ID)
    assert r.returncode == 0 and r.stdout.strip() == str(target(env))
    r = cli(env, "models", "verify", ID)
    assert r.returncode == 0 and "OK" in r.stdout and hashlib.sha256(payload).hexdigest() in r.stdout
    r = cli(env, "segment", EXAMPLE, "-o", target(env).parent.parent / "out", "--model", ID)
    assert r.returncode == 0, r.stderr
    r = cli(env, "models", "rm", ID)
    assert r.returncode == 0 and not target(env).exists()
    assert cli(env, "models", "path", ID).returncode == 11


def test_a_dropped_connection_is_resumed_not_refetched(env, hub, payload):
    r = cli(env, "models", "download", ID, mode="drop", hub=hub)
    assert r.returncode == 0, r.stderr
    assert target(env).read_bytes() == payload
    first, second = hub.gets(FILE)
    assert first.range is None and 0 < first.sent < len(payload)
    assert second.range == f"bytes={first.sent}-" and second.status == 206
    assert first.sent + second.sent == len(payload)  # every byte crossed the wire once


def test_a_server_that_ignores_range_restarts_from_zero(env, hub, payload):
    part = Path(str(target(env)) + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(payload[:300_000])
    r = cli(env, "models", "download", ID, mode="norange", hub=hub)
    assert r.returncode == 0, r.stderr
    assert target(env).read_bytes() == payload
    (get,) = hub.gets(FILE)
    assert get.range == "bytes=300000-" and get.status == 200


def test_a_stale_part_longer_than_the_file_starts_over(env, hub, payload):
    part = Path(str(target(env)) + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(payload + b"extra")
    r = cli(env, "models", "download", ID, mode="ok", hub=hub)
    assert r.returncode == 0, r.stderr
    assert target(env).read_bytes() == payload


def test_404_is_a_clear_error(env, hub):
    r = cli(env, "models", "download", ID, mode="missing", hub=hub)
    assert r.returncode == 13, r.stderr
    assert "HTTP 404" in r.stderr and "put it in" in r.stderr
    assert len(hub.gets(FILE)) == 1  # a 404 is not retried
    assert not target(env).exists()


def test_500_then_success(env, hub, payload):
    r = cli(env, "models", "download", ID, mode="flaky", hub=hub)
    assert r.returncode == 0, r.stderr
    assert [g.status for g in hub.gets(FILE)] == [500, 200]
    assert "HTTP 500" in r.stderr and "retrying" in r.stderr
    assert target(env).read_bytes() == payload


def test_a_stalled_transfer_times_out_and_resumes(env, hub, payload):
    r = cli(dict(env, SAPIENS_SEG_LOW_SPEED_TIME="1"), "models", "download", ID, mode="stall", hub=hub)
    assert r.returncode == 0, r.stderr
    first, second = hub.gets(FILE)
    assert second.range == "bytes=1000-"
    assert target(env).read_bytes() == payload


def test_wrong_bytes_are_refused_and_nothing_is_cached(env, hub, payload):
    r = cli(env, "models", "download", ID, mode="wrong", hub=hub)
    assert r.returncode == 12, r.stderr
    assert "expected sha256 " + hashlib.sha256(payload).hexdigest() in r.stderr
    assert not target(env).exists()
    assert not Path(str(target(env)) + ".part").exists()


def test_two_processes_one_transfer(env, hub, payload):
    hub.slow_delay = 0.05  # ~4 s transfer: the second process surely starts while it runs
    a = start(env, "models", "download", ID, mode="slow", hub=hub)
    wait_for_part(env, 1, a)
    b = start(env, "models", "download", ID, mode="slow", hub=hub)
    out_a, err_a = a.communicate(timeout=120)
    out_b, err_b = b.communicate(timeout=120)
    assert a.returncode == 0 and b.returncode == 0, (err_a, err_b)
    assert out_a == out_b
    assert "waiting for another process" in err_b
    assert len(hub.gets(FILE)) == 1
    assert target(env).read_bytes() == payload


def test_a_killed_download_resumes(env, hub, payload):
    a = start(env, "models", "download", ID, mode="slow", hub=hub)
    wait_for_part(env, 400_000, a)
    a.kill()
    a.wait()
    kept = Path(str(target(env)) + ".part").stat().st_size
    assert 0 < kept < len(payload) and not target(env).exists()
    r = cli(env, "models", "download", ID, mode="ok", hub=hub)
    assert r.returncode == 0, r.stderr
    resumed = hub.gets(FILE)[-1]
    assert resumed.range == f"bytes={kept}-" and resumed.sent == len(payload) - kept
    assert target(env).read_bytes() == payload


def test_ctrl_c_cancels_and_keeps_the_part(env, hub):
    a = start(env, "models", "download", ID, mode="slow", hub=hub)
    wait_for_part(env, 200_000, a)
    a.send_signal(signal.SIGINT)
    _, err = a.communicate(timeout=60)
    # A cancel, not a failure: 130, and no advice to fetch the file by hand.
    assert a.returncode == 130 and "cancelled" in err and "interrupted" in err, err
    assert "by hand" not in err
    assert Path(str(target(env)) + ".part").stat().st_size > 0 and not target(env).exists()


def test_offline_never_opens_a_connection(env, hub, payload):
    for flag in ("SAPIENS_SEG_OFFLINE", "HF_HUB_OFFLINE"):
        r = cli(dict(env, **{flag: "1"}), "models", "download", ID, mode="ok", hub=hub)
        assert r.returncode == 14, r.stderr
        for part in (FILE, hashlib.sha256(payload).hexdigest(), hub.endpoint("ok"),
                     str(target(env).parent)):
            assert part in r.stderr
    assert hub.gets() == []


def test_the_hugging_face_cache_is_reused(env, hub, payload):
    snap = Path(env["HF_HUB_CACHE"]) / "models--test--tiny-b" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    (snap / FILE).write_bytes(payload)
    r = cli(env, "models", "download", ID, mode="ok", hub=hub)
    assert r.returncode == 0 and r.stdout.strip() == str(snap / FILE)
    assert hub.gets() == [] and not target(env).exists()
    # A corrupt copy there is refused, not used.
    (snap / FILE).write_bytes(payload[:100] + bytes([payload[100] ^ 1]) + payload[101:])
    r = cli(env, "segment", EXAMPLE, "-o", snap / "out", "--model", ID, mode="ok", hub=hub)
    assert r.returncode == 12 and "checksum mismatch" in r.stderr


def _without_big_files():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_a_full_disk_gives_a_clean_error(env, hub):
    r = cli(env, "models", "download", ID, mode="ok", hub=hub, preexec_fn=_without_big_files)
    assert r.returncode == 19, r.stderr
    assert "File too large" in r.stderr and "kept to resume" in r.stderr
    assert not target(env).exists()


def test_licence_and_unverified_gates(tmp_path, env, hub, payload):
    write_card(tmp_path / "cards", payload, id="dl-nc", license={"id": "CC-BY-NC-4.0",
               "commercial_use": False, "url": None})
    write_card(tmp_path / "cards", payload, id="dl-unpinned", sha256=None)
    out = tmp_path / "out"
    r = cli(env, "segment", EXAMPLE, "-o", out, "--model", "dl-nc", mode="ok", hub=hub)
    assert r.returncode == 15 and "--accept-noncommercial" in r.stderr
    assert hub.gets() == []  # refused before any transfer
    r = cli(env, "segment", EXAMPLE, "-o", out, "--model", "dl-unpinned", mode="ok", hub=hub)
    assert r.returncode == 12 and "SAPIENS_SEG_ALLOW_UNVERIFIED=1" in r.stderr
    assert hub.gets() == []
    r = cli(env, "segment", EXAMPLE, "-o", out, "--model", "dl-unpinned", "--allow-unverified",
            mode="ok", hub=hub)
    assert r.returncode == 0, r.stderr
    assert hashlib.sha256(payload).hexdigest() in r.stderr  # printed so it can be pinned


def test_hf_token_is_sent_only_when_asked(env, hub):
    e = dict(env, HF_TOKEN="hf_secret_for_test")
    assert cli(e, "models", "download", ID, mode="ok", hub=hub).returncode == 0
    assert hub.gets(FILE)[-1].authorization is None
    cli(e, "models", "rm", ID)
    assert cli(e, "models", "download", ID, "--use-hf-token", mode="ok", hub=hub).returncode == 0
    assert hub.gets(FILE)[-1].authorization == "Bearer hf_secret_for_test"


def test_progress_bar_on_a_terminal(env, hub):
    code, text = run_with_tty_stderr([CLI, "models", "download", ID],
                                     dict(env, HF_ENDPOINT=hub.endpoint("slow")))
    assert code == 0
    assert "100%" in text and "MB/s" in text and "\r" in text and FILE[:20] in text
    # Not on a pipe: stderr stays free of progress lines.
    cli(env, "models", "rm", ID)
    r = cli(env, "models", "download", ID, mode="ok", hub=hub)
    assert "MB/s" not in r.stderr


def test_an_unwritable_cache_gives_a_clean_error(tmp_path, env, hub):
    # Tests run as root, where permission bits do not stop writes; a cache path that runs
    # through a regular file fails the same way (the folder cannot be created).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    r = cli(dict(env, SAPIENS_SEG_HOME=str(blocker / "home")), "models", "download", ID,
            mode="ok", hub=hub)
    assert r.returncode == 19, r.stderr
    assert "cannot create" in r.stderr and str(blocker) in r.stderr
    assert hub.gets() == []
