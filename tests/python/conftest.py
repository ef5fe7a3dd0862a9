"""What the Python suites share: where this build, its fixtures, its CLI and its extension are.

ctest runs each test file as its own test (python.<file>, tests/CMakeLists.txt) and sets
SAPIENS_SEG_BUILD and SAPIENS_SEG_FIXTURES; by hand they default to build/ and build/fixtures:

    SAPIENS_SEG_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/python/test_cli.py

pytest imports this file before the test files and puts its folder on sys.path, so a test file
takes these names with `from conftest import ...`, and the helpers beside it (hub_server, ptyrun)
as plain modules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SAPIENS_SEG_BUILD", REPO / "build"))
FIXTURES = Path(os.environ.get("SAPIENS_SEG_FIXTURES", BUILD / "fixtures"))
PKG_PARENT = BUILD / "python"  # holds this build's sapiens_seg package
CLI = BUILD / "bin" / "sapiens-seg"


def extension_built() -> bool:
    return any((PKG_PARENT / "sapiens_seg").glob("_core*"))


def use_built_package() -> None:
    """Skips the calling test file when this build has no extension; else puts this build's
    package first on sys.path, whatever else (an installed wheel, the .venv .pth) is there, and
    forgets a sapiens_seg imported from elsewhere, so the file's `import sapiens_seg` is this
    build's."""
    if not extension_built():
        pytest.skip(f"the Python extension is not built in {PKG_PARENT / 'sapiens_seg'}",
                    allow_module_level=True)
    sys.path.insert(0, str(PKG_PARENT))
    loaded = sys.modules.get("sapiens_seg")
    if loaded is not None and Path(loaded.__file__).resolve().parent.parent != PKG_PARENT.resolve():
        for name in [m for m in sys.modules if m == "sapiens_seg" or m.startswith("sapiens_seg.")]:
            del sys.modules[name]


def use_oracles_and_tools() -> None:
    """Makes the oracles and the fixture makers (tests/reference, tests/fixtures: `from reference
    import sapiens2`) and tools/ (the ONNX export) importable."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "tools")]
