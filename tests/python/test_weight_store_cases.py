"""The weight store on what users' machines hold (issue 39): a folder or a device where a
checkpoint should be is reported as what it is, never as "not on this machine"; a process without
HOME (a service, a container) never makes its cache in the working folder."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import CLI

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")

CARD = "sapiens-seg-0.3b-goliath"


def card_file() -> str:
    cards = Path(CLI).resolve().parent.parent / "share" / "sapiens_seg" / "cards"
    return json.loads((cards / f"{CARD}.json").read_text())["file"]


def run(*args, env, cwd=None):
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120, check=False)


def clean_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    env.update(SAPIENS_SEG_HOME=str(tmp_path / "home"), HF_HUB_CACHE=str(tmp_path / "hf"),
               SAPIENS_SEG_OFFLINE="1")
    env.update(extra)
    return env


@pytest.mark.parametrize("kind", ["folder", "link to a folder", "link to /dev/zero"])
def test_something_else_where_the_weights_should_be_is_named_for_what_it_is(tmp_path, kind):
    placed = tmp_path / "weights"
    placed.mkdir()
    target = placed / card_file()
    if kind == "folder":
        target.mkdir()
    elif kind == "link to a folder":
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.symlink_to("/dev/zero")
    env = clean_env(tmp_path, SAPIENS_SEG_WEIGHTS_PATH=str(placed))
    what = "a character device" if "dev" in kind else "a directory"

    listing = run("models", "list", env=env)
    assert listing.returncode == 0, listing.stderr
    line = next(ln for ln in listing.stdout.splitlines() if ln.startswith(CARD + " "))
    assert f"BAD (not a file: it is {what})" in line, line

    img = Path(__file__).resolve().parents[2] / "examples" / "astronaut.jpg"
    seg = run("segment", str(img), "-o", str(tmp_path / "out"), "--model", CARD,
              "--accept-noncommercial", env=env)
    assert seg.returncode == 17, seg.stderr  # invalid_input, not 14 (offline) or 11 (not found)
    assert f"is {what}" in seg.stderr and "offline" not in seg.stderr, seg.stderr

    verify = run("models", "verify", CARD, env=env)
    assert verify.returncode == 17 and f"is {what}" in verify.stderr, verify.stderr


def test_without_home_the_cache_is_not_made_in_the_working_folder(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SAPIENS_SEG_", "HF_", "XDG_")) and k != "HOME"}
    work = tmp_path / "work"
    work.mkdir()
    r = run("models", "path", CARD, env=env, cwd=work)
    # The account's home from the password database: never relative, never the working folder.
    path = r.stdout.strip()
    assert path.startswith("/") and not path.startswith(str(work)), (path, r.stderr)
    assert not (work / ".cache").exists()
    assert list(work.iterdir()) == []
