"""Type stub of the native module sapiens_seg._core (pybind11 over libsapiens_seg).

Internal: sapiens_seg.segmentation checks arguments before they get here. Items are
``(ITEM_FILE, os.fsencode(path))``, ``(ITEM_ENCODED, bytes-like)`` or
``(ITEM_RGB, HxWx3 uint8 array with packed pixels)``.

Errors: every C++ exception is raised as the sapiens_seg.errors class of its library error code
(``ErrorCode`` 1-11; 11, out of memory, as ``OutOfMemoryError``, also a ``MemoryError``); a C++
exception that is not a library error (a raw LibTorch error, ``std::bad_alloc``) is converted to
one first, so none reaches Python as a bare ``RuntimeError``.
"""

from typing import Any, Callable, Optional, Union

import numpy as np
import numpy.typing as npt

ITEM_FILE: int
ITEM_ENCODED: int
ITEM_RGB: int

Item = tuple[int, Union[bytes, bytearray, memoryview, npt.NDArray[np.uint8]]]

def version() -> str: ...

class NativeResult:
    @property
    def height(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def labels(self) -> npt.NDArray[np.uint8]: ...
    @property
    def logits(self) -> Optional[npt.NDArray[np.float32]]: ...
    @property
    def image(self) -> Optional[npt.NDArray[np.uint8]]: ...
    @property
    def classes(self) -> list[str]: ...
    @property
    def palette(self) -> npt.NDArray[np.uint8]: ...
    @property
    def backend(self) -> tuple[str, str, str]: ...
    @property
    def timings(self) -> dict[str, float]: ...
    @property
    def warnings(self) -> list[str]: ...
    def overlay(self, image: Optional[npt.NDArray[np.uint8]], opacity: float) -> npt.NDArray[np.uint8]: ...

class Model:
    # One network batch: segmentation.Model.__call__ splits lists by its batch_size first.
    def segment(self, items: list[Item], logits: bool) -> list[NativeResult]: ...
    @property
    def info(self) -> dict[str, Any]: ...

def load(
    name_or_path: bytes,
    mode: str,
    device: str,
    dtype: str,
    normalization: str,
    accept_noncommercial: bool,
    allow_unverified: bool,
    threads: int,
    input_height: int,
    input_width: int,
    pipeline: str = ...,
    cubic: str = ...,
    progress: Optional[Callable[[str, int, int, float], bool]] = ...,
) -> Model: ...
def fetch(name: bytes, progress: Optional[Callable[[str, int, int, float], bool]] = ...) -> str: ...
def list_cards() -> list[dict[str, Any]]: ...
def find_card(id: str) -> dict[str, Any]: ...
def check_license(id: str, accept_noncommercial: bool) -> None: ...
def output_bases(paths: list[bytes], output_dir: bytes) -> list[str]: ...
def expand_inputs(args: list[bytes], extensions: str, recursive: bool,
                  output_dir: bytes) -> dict[str, Any]: ...
def option_names() -> dict[str, list[str]]: ...
def error_codes() -> list[tuple[int, str, int]]: ...
def system_info() -> dict[str, Any]: ...
def read_image(item: Item) -> tuple[npt.NDArray[np.uint8], list[str]]: ...
def resize(
    image: npt.NDArray[np.uint8],
    height: int,
    width: int,
    interpolation: str,
    cubic: str,
    device: str,
) -> npt.NDArray[np.uint8]: ...
