"""The README and docs/: the front page's commands are the ones CI runs, and every relative link
in the user documentation leads to a file (and a heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO
README = REPO / "README.md"



def pages() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md",
            REPO / "benchmarks" / "results" / "README.md"]


def code_blocks(text: str, lang: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(rf"```{lang}\n(.*?)```", text, re.S)]


def test_the_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_set_up_commands_are_the_ones_ci_runs():
    setup = README.read_text().split("\n## Set-up\n", 1)[1].split("\n## ", 1)[0]
    main_job, tests = code_blocks(setup, "sh")[:2]
    build = "tools/setup.sh && cmake --preset release && cmake --build --preset release"
    assert main_job == (f"{build} && build/bin/sapiens-seg segment examples/astronaut.jpg -o out/ "
                        "--accept-noncommercial")
    assert (REPO / "examples" / "astronaut.jpg").is_file()
    assert tests == f"{build} && ctest --preset release"
    # CI runs the test command verbatim (its status taken with `||`).
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert f"{tests} ||" in ci


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_every_relative_link_resolves():
    broken = []
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_links_every_docs_page():
    text = README.read_text()
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md"))
               if f"(docs/{p.name})" not in text and f"(docs/{p.name}#" not in text]
    assert not missing, f"README.md does not link {missing}"
