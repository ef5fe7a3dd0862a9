"""Python inputs that are not images: each gets the library's InvalidInputError saying what is
wrong with it, never a numpy/torch error from inside the package (issue 39)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FIXTURES, REPO, use_built_package

use_built_package()

import sapiens_seg  # noqa: E402
from sapiens_seg import segmentation  # noqa: E402

TINY = FIXTURES / "tiny_b_torchscript.pt2"


@pytest.fixture(scope="module")
def model():
    return segmentation.load(TINY, device="cpu", accept_noncommercial=True)


@pytest.mark.parametrize("shape", [(0, 0, 3), (0, 40, 3), (40, 0, 3)])
def test_an_empty_array_says_it_is_empty(model, shape):
    with pytest.raises(sapiens_seg.InvalidInputError, match="the image is empty"):
        model(np.zeros(shape, np.uint8))


def test_a_tensor_without_pixels_or_not_dense_says_so(model):
    torch = pytest.importorskip("torch")
    with pytest.raises(sapiens_seg.InvalidInputError, match="'meta' device has no pixels"):
        model(torch.empty((40, 40, 3), dtype=torch.uint8, device="meta"))
    with pytest.raises(sapiens_seg.InvalidInputError, match="dense tensor"):
        model(torch.zeros((40, 40, 3), dtype=torch.uint8).to_sparse())
    # A permuted (strided) view is fine.
    t = torch.zeros((64, 48, 3), dtype=torch.uint8)
    assert model(t.permute(1, 0, 2).permute(1, 0, 2)).labels.shape == (64, 48)


def test_an_undecodable_item_of_a_list_is_named_by_its_index(model, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff" + b"\0" * 64)
    ok = REPO / "examples" / "astronaut.jpg"
    with pytest.raises(sapiens_seg.InvalidInputError, match=r"^x\[1\]: .*bad\.jpg"):
        model([ok, bad, ok], batch_size=3)
    with pytest.raises(sapiens_seg.InvalidInputError, match=r"^x\[4\]: "):
        model([ok, ok, ok, ok, bytes(bad.read_bytes())], batch_size=2)
