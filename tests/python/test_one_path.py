"""One path for every caller (issue 38): the CLI, the Python package and the Ray driver take every
option of the library's table with the same name and default, and report Timings with the one
meaning the C++ API documents (total = decode + preprocess + network + postprocess).

Run through ctest (it sets SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES)."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess

import pytest

from conftest import CLI, FIXTURES, REPO, use_built_package

use_built_package()

import sapiens_seg  # noqa: E402
from sapiens_seg import _core, segmentation  # noqa: E402

EXAMPLE = REPO / "examples" / "astronaut.jpg"
TINY = FIXTURES / "tiny_b_torchscript.pt2"
SPECS = _core.option_specs()
STAGES = ("decode", "preprocess", "network", "postprocess")


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("SAPIENS_SEG_", "HF_"))}


def _help(*args: str) -> str:
    r = subprocess.run([str(CLI), *args, "--help"], capture_output=True, text=True, env=_env(),
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_the_table_has_every_group_and_python_sees_it():
    groups = {s["group"] for s in SPECS}
    assert groups == {"load", "segment", "run"}
    assert segmentation.OPTION_SPECS == tuple(SPECS)
    assert segmentation.DEFAULT_BATCH_SIZE == int(
        next(s["default"] for s in SPECS if s["name"] == "batch_size"))


@pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")
def test_the_cli_has_a_flag_for_every_load_and_run_option_with_the_tables_default():
    text = _help("segment")
    for spec in SPECS:
        if spec["group"] == "segment":
            continue  # --save items (below)
        line = next((ln for ln in text.splitlines() if re.search(rf"{_flag(spec['name'])}\b", ln)),
                    None)
        assert line is not None, f"segment has no {_flag(spec['name'])}"
        if spec["type"] != "bool" and spec["default"]:
            assert f"={spec['default']}" in line, (spec["name"], line)


@pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")
def test_the_server_has_a_flag_for_every_load_option_and_batches_by_the_run_default():
    text = _help("serve")
    for spec in SPECS:
        if spec["group"] != "load":
            continue  # segment options are per request (output=); batches are --max-batch
        line = next((ln for ln in text.splitlines() if re.search(rf"{_flag(spec['name'])}\b", ln)),
                    None)
        assert line is not None, f"serve has no {_flag(spec['name'])}"
        if spec["type"] != "bool" and spec["default"]:
            assert f"={spec['default']}" in line, (spec["name"], line)
    batch = next(s for s in SPECS if s["name"] == "batch_size")["default"]
    assert re.search(rf"--max-batch [^\n]*={batch}\b", text), "serve's --max-batch default"


@pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")
def test_the_cli_writes_every_segment_option_as_a_save_item():
    text = _help("segment")
    items = text[text.index("--save"):].split("any of:")[1].split("\n")[0].split()
    for spec in SPECS:
        if spec["group"] == "segment":
            assert spec["name"] in items, spec["name"]


def test_python_load_takes_every_option_by_its_name_with_the_tables_default(tmp_path):
    sig = inspect.signature(segmentation.load)
    # The ones load() spells out keep the table's default (None is the table's "" / "default").
    table_default = {s["name"]: segmentation.option_default(s["name"]) for s in SPECS}
    assert sig.parameters["mode"].default == table_default["mode"]
    assert sig.parameters["device"].default is None and table_default["device"] == ""
    assert sig.parameters["dtype"].default is None and table_default["dtype"] == "default"
    assert sig.parameters["logits"].default == table_default["logits"]
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    # Every option of the table, at its default, in one call: none is refused.
    explicit = {"mode", "device", "dtype", "logits"}
    kwargs = {n: d for n, d in table_default.items() if n not in explicit}
    model = segmentation.load(TINY, device="cpu", **{**kwargs, "accept_noncommercial": True})
    assert model.batch_size == table_default["batch_size"]
    for name in kwargs:
        assert name in segmentation.load.__doc__, f"load()'s docstring does not list {name}"
    with pytest.raises(TypeError, match="unexpected keyword"):
        segmentation.load(TINY, no_such_option=1)
    # Model.__call__ and Model.run take every segment option.
    r = model(EXAMPLE, raw_logits=True)
    assert r.raw_logits is not None and r.raw_logits.shape[0] == len(r.classes)


def test_the_ray_driver_has_a_flag_for_every_option_with_the_tables_default():
    pytest.importorskip("ray")
    from sapiens_seg.ray import _command

    parser = _command._parser()
    actions = {a.dest: a for a in parser._actions}
    for spec in SPECS:
        assert spec["name"] in actions, f"the Ray driver has no {_flag(spec['name'])}"
        assert _flag(spec["name"]) in actions[spec["name"]].option_strings
        assert actions[spec["name"]].default == segmentation.option_default(spec["name"])


def _assert_one_meaning(t: dict, decoded: bool, where: str) -> None:
    for k in (*STAGES, "total"):
        assert k in t, (where, t)
        assert t[k] >= 0, (where, t)
    assert t["total"] == pytest.approx(sum(t[k] for k in STAGES), rel=1e-9, abs=1e-6), (where, t)
    assert (t["decode"] > 0) == decoded, (where, t)
    assert t["network"] > 0, (where, t)


@pytest.mark.skipif(not CLI.exists(), reason=f"{CLI} is not built")
def test_timings_have_one_meaning_in_the_cli_summary_python_and_prepare_run(tmp_path):
    env = _env()
    r = subprocess.run([str(CLI), "segment", str(EXAMPLE), "-o", str(tmp_path / "out"), "-m",
                        str(TINY), "--accept-noncommercial", "--device", "cpu", "-q"],
                       capture_output=True, text=True, env=env, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    entry = json.loads((tmp_path / "out" / "summary.json").read_text())["images"][0]
    _assert_one_meaning(entry["timings_ms"], decoded=True, where="CLI summary.json")

    model = segmentation.load(TINY, device="cpu", accept_noncommercial=True)
    from_file = model(EXAMPLE)
    _assert_one_meaning(from_file.timings, decoded=True, where="Python, a file")
    pixels = segmentation.read_image(EXAMPLE)
    _assert_one_meaning(model(pixels).timings, decoded=False, where="Python, pixels")
    # The two halves: prepare's stages carry into run's result unchanged.
    ready = model.prepare(EXAMPLE)
    pt = ready.timings
    (res,) = model.run([ready])
    _assert_one_meaning(res.timings, decoded=True, where="Python prepare + run")
    assert res.timings["decode"] == pt["decode"]
    assert res.timings["preprocess"] >= pt["preprocess"]
    # ... and the labels are those of the call and of the CLI.
    assert (res.labels == from_file.labels).all()
    import cv2
    cli_labels = cv2.imread(str(tmp_path / "out" / "astronaut_seg.png"), cv2.IMREAD_UNCHANGED)
    assert (cli_labels == from_file.labels).all()


def test_a_batch_of_prepared_images_gives_each_single_calls_labels():
    model = segmentation.load(TINY, device="cpu", accept_noncommercial=True)
    images = [EXAMPLE, FIXTURES / "images" / "synth_landscape_480x640.png"]
    single = [model(p).labels for p in images]
    batched = model.run([model.prepare(p) for p in images])
    for a, b in zip(single, batched):
        assert (a == b.labels).all()


def test_a_failed_item_of_a_list_names_its_index(tmp_path):
    model = segmentation.load(TINY, device="cpu", accept_noncommercial=True, batch_size=2)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    with pytest.raises(sapiens_seg.InvalidInputError, match=r"^x\[2\]: "):
        model([EXAMPLE, EXAMPLE, bad])
    with pytest.raises(TypeError, match="Prepared"):
        model.run([EXAMPLE])
