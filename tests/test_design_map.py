"""docs/design.md's tree of ``aiovec/`` names every module there is, and no other.

The map went stale once (issue 19: it lacked ``backends/ray.py``, ``compat/``,
``_make.py`` and ``_cli/``); a module added, moved or removed without the map
fails here.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aiovec"
DESIGN = ROOT / "docs" / "design.md"

NAME = re.compile(r"[\w.]+\.py\b|\w+/")


def _tree_lines() -> list[str]:
    """The lines of the fenced block that starts with ``aiovec/``."""
    text = DESIGN.read_text(encoding="utf-8")
    match = re.search(r"^```\naiovec/\n(.*?)^```", text, re.M | re.S)
    assert match, "docs/design.md has no tree of aiovec/ in a fenced block"
    return match.group(1).splitlines()


def _mapped() -> set[str]:
    """The files the tree names, as paths relative to ``aiovec/``.

    Each line is ``<indent><names>   <description>``; names are ``x.py`` (or
    several, comma-separated) or a folder ``x/``; a line that only continues a
    description (indented past the names, with no name of its own first) is passed over.
    """
    files: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, folder) of the open folders
    for line in _tree_lines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        head = re.split(r" {2,}", stripped, maxsplit=1)[0]
        names = [n for n in re.split(r",\s*", head) if NAME.fullmatch(n)]
        if not names:
            continue
        while folders and folders[-1][0] >= indent:
            folders.pop()
        prefix = "".join(folder for _, folder in folders)
        for name in names:
            if name.endswith("/"):
                folders.append((indent, name))
            else:
                files.add(prefix + name)
    return files


def test_the_design_tree_lists_exactly_the_modules() -> None:
    on_disk = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    mapped = _mapped()
    assert not on_disk - mapped, f"modules missing from docs/design.md: {sorted(on_disk - mapped)}"
    assert not mapped - on_disk, f"docs/design.md names no such module: {sorted(mapped - on_disk)}"
