"""`sapiens-seg models` and the weight checks a new user meets: broken cards in a card folder,
files of the wrong size, checkpoints given by path (renamed, damaged, replaced).

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, FIXTURES, CLI
EXAMPLE = REPO / "examples" / "astronaut.jpg"

pytestmark = pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")


@pytest.fixture()
def env(tmp_path):
    """No weights anywhere, an empty cache, never the network."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}
    base.update(SAPIENS_SEG_HOME=str(tmp_path / "home"), HF_HUB_CACHE=str(tmp_path / "hf"),
                SAPIENS_SEG_OFFLINE="1")
    return base


def run(env, *args):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)


def broken_card_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "garbage.json").write_bytes(b"\x00\xff not json")
    (folder / "empty.json").write_text("")
    card = json.loads((FIXTURES / "cards" / "tiny_a.json").read_text())
    card["input"] = {"height": "tall", "width": 192}
    (folder / "types.json").write_text(json.dumps(card))
    (folder / "x.json").mkdir()
    return folder


def test_broken_cards_are_skipped_with_one_warning_each(tmp_path, env):
    env["SAPIENS_SEG_CARDS"] = str(broken_card_folder(tmp_path / "cards"))
    r = run(env, "segment", EXAMPLE, "-o", tmp_path / "out", "--model",
            FIXTURES / "tiny_a_torchscript.pt2", "--save", "labels")
    assert r.returncode == 0, r.stderr
    for name in ("garbage.json", "empty.json", "types.json", "x.json"):
        assert r.stderr.count(f"{name}") == 1, r.stderr
    assert r.stderr.count("skipping a broken model card") == 4
    assert "'height'" in r.stderr and "is a directory" in r.stderr
    r = run(env, "models", "list")
    assert r.returncode == 0, r.stderr
    broken = [line for line in r.stdout.splitlines() if line.startswith("BROKEN CARD")]
    assert len(broken) == 4 and any("x.json" in line for line in broken)
    assert "sapiens-seg-0.3b-goliath" in r.stdout  # the others are still there


def test_models_list_is_aligned_and_says_when_a_file_is_wrong(tmp_path, env):
    weights = tmp_path / "weights"
    weights.mkdir()
    # A hand-placed file of the wrong size under the 0.3b card's name.
    wrong = b"PK\x03\x04 not the real file"
    (weights / "sapiens_0.3b_goliath_best_goliath_mIoU_7673_epoch_194_torchscript.pt2"
     ).write_bytes(wrong)
    shutil.copy2(FIXTURES / "tiny_a_torchscript.pt2", weights / "tiny_a_torchscript.pt2")
    env.update(SAPIENS_SEG_WEIGHTS_PATH=str(weights), SAPIENS_SEG_CARDS=str(FIXTURES / "cards"))
    r = run(env, "models")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines[0]
    assert header.split() == ["ID", "LICENCE", "SIZE", "SHA-256", "WEIGHTS"]
    cols = [header.index(h) for h in ("LICENCE", "SIZE", "SHA-256", "WEIGHTS")]
    rows = {line.split()[0]: line for line in lines[1:]}
    for line in rows.values():  # every column starts where its header does
        for c in cols:
            assert line[c - 2:c] == "  " and line[c] != " ", (line, c)
    assert (f"BAD (wrong size: {len(wrong)} bytes, the card says 1358871599"
            in rows["sapiens-seg-0.3b-goliath"])
    assert "not downloaded" in rows["sapiens-seg-1b-goliath"]
    assert "present, not verified yet" in rows["fixture-tiny-a"]
    assert run(env, "models", "verify", "fixture-tiny-a").returncode == 0
    rows = {line.split()[0]: line for line in run(env, "models").stdout.splitlines()}
    assert "verified: " in rows["fixture-tiny-a"]


def test_a_renamed_noncommercial_file_needs_the_licence(tmp_path, env):
    card = json.loads((FIXTURES / "cards" / "tiny_a.json").read_text())
    card.update(id="fixture-nc", file="release.pt2")
    card["license"] = {"id": "CC-BY-NC-4.0", "commercial_use": False, "url": None}
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / "nc.json").write_text(json.dumps(card))
    env["SAPIENS_SEG_CARDS"] = str(tmp_path / "cards")
    renamed = tmp_path / "renamed.pt2"
    shutil.copy(FIXTURES / "tiny_a_torchscript.pt2", renamed)
    r = run(env, "segment", EXAMPLE, "-o", tmp_path / "out", "--model", renamed)
    assert r.returncode == 15, r.stderr
    assert "fixture-nc" in r.stderr and "--accept-noncommercial" in r.stderr
    r = run(env, "segment", EXAMPLE, "-o", tmp_path / "out", "--model", renamed,
            "--accept-noncommercial", "--save", "labels")
    assert r.returncode == 0, r.stderr


def test_a_damaged_archive_is_refused_and_a_replaced_safetensors_needs_verify(tmp_path, env):
    r = run(env, "segment", EXAMPLE, "-o", tmp_path / "out", "--model",
            FIXTURES / "broken_flipped_byte.pt2")
    assert r.returncode == 12, r.stderr  # checksum mismatch
    assert "CRC-32" in r.stderr and not (tmp_path / "out" / "astronaut_seg.png").exists()

    own = tmp_path / "own.safetensors"
    shutil.copy(FIXTURES / "s2_tiny.safetensors", own)
    os.utime(own, (os.path.getatime(own) - 10, os.path.getmtime(own) - 10))
    r = run(env, "segment", EXAMPLE, "-o", tmp_path / "out", "--model", own, "--save", "labels")
    assert r.returncode == 0, r.stderr
    assert "matches no model card; its SHA-256 is" in r.stderr  # printed at first use
    data = bytearray(own.read_bytes())
    data[-3] ^= 0x01
    own.write_bytes(bytes(data))
    r = run(env, "segment", EXAMPLE, "-o", tmp_path / "out2", "--model", own)
    assert r.returncode == 12, r.stderr
    assert "changed since it was first used" in r.stderr and "models verify" in r.stderr
    r = run(env, "models", "verify", own)
    assert r.returncode == 0, r.stderr
    assert "RECORDED" in r.stdout and str(own) in r.stdout
    r = run(env, "segment", EXAMPLE, "-o", tmp_path / "out2", "--model", own, "--save", "labels")
    assert r.returncode == 0, r.stderr


def test_offline_message_names_the_download_command_and_hf_endpoint(tmp_path, env):
    r = run(env, "segment", EXAMPLE, "-o", tmp_path / "out", "--accept-noncommercial")
    assert r.returncode == 14, r.stderr
    assert "sapiens-seg models download sapiens-seg-0.3b-goliath" in r.stderr
    assert "HF_ENDPOINT" in r.stderr
