"""Command-line flags made from the library's option table, for the package's commands (the Ray
driver, the Ray Serve command), named and defaulted as the C++ CLI's (src/cli/option_flags.*)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping

from .segmentation import OPTION_SPECS, option_default


def add_option_flags(p: argparse.ArgumentParser, *, skip_groups: Iterable[str] = (),
                     meanings: Mapping[str, str] | None = None) -> None:
    """One flag per row of the table (``--accept-noncommercial``, ``--batch-size``, ...), except
    the rows of `skip_groups`; `meanings` replaces a row's default in its help where the command
    gives the option another meaning when unset."""
    skip = set(skip_groups)
    meanings = meanings or {}
    for spec in OPTION_SPECS:
        if spec["group"] in skip:
            continue
        flag = "--" + spec["name"].replace("_", "-")
        help_text = spec["help"] + (f"; default: {meanings[spec['name']]}"
                                    if spec["name"] in meanings else "")
        default = option_default(spec["name"])
        if spec["type"] == "bool":
            p.add_argument(flag, action="store_true", default=default, help=help_text)
        elif spec["type"] == "int":
            p.add_argument(flag, type=int, default=default, help=help_text + " (%(default)s)")
        elif spec["type"] == "choice":
            p.add_argument(flag, default=default, choices=spec["choices"],
                           help=help_text + " (%(default)s)")
        else:
            p.add_argument(flag, default=default, help=help_text)
