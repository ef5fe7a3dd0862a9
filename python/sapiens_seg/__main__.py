"""``python -m sapiens_seg ARGS`` runs the ``sapiens-seg`` command line tool with ARGS.

The binary is the one built or installed with this package: ``sapiens_seg/bin/sapiens-seg`` in
an installed wheel, ``<build>/bin/sapiens-seg`` for the package assembled in ``<build>/python``
by the CMake build. The process is replaced by it, so its output and exit status are the CLI's
(0 success, 2 usage error, 10 + error code otherwise)::

    python -m sapiens_seg info
    python -m sapiens_seg segment photo.jpg -o out/ --model model.pt2
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_NAME = "sapiens-seg"


def find_cli() -> str | None:
    """The path of the ``sapiens-seg`` binary that belongs to this package, or None."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "bin" / _NAME, here.parent.parent / "bin" / _NAME):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def main(argv: list[str] | None = None) -> int:
    """Replaces this process with the CLI; returns (127) only when the CLI cannot be found."""
    args = sys.argv[1:] if argv is None else list(argv)
    cli = find_cli()
    if cli is None:
        here = Path(__file__).resolve().parent
        print(f"{_NAME}: the command line tool was not found next to the package ({here / 'bin'} "
              f"or {here.parent.parent / 'bin'}); build it with CMake or reinstall the package",
              file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cli, [_NAME, *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
