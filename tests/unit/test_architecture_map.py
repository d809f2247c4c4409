"""docs/architecture.md's package map held against the tree, so it cannot drift: every package of
radixrt has an entry, every Protocol class (a seam one subsystem is handed from outside) is named as
a seam of its package, and every seam named exists (its module imports, the name is in it).

Truth: the tree itself (packages are the folders with an __init__.py; Protocols found by reading
each module's syntax tree, not by importing it)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "radixrt"
DOC = REPO / "docs" / "architecture.md"
ENTRY = re.compile(r"^- \*\*`(radixrt[\w.]*)`\*\*:(.*?)(?=^- \*\*`|\Z)", re.S | re.M)


def package_map() -> dict[str, list[str]]:
    """{package: its seams as named (module.name, relative to the package)}."""
    text = DOC.read_text()
    section = text[text.index("## Package map") : text.index("## How a request flows")]
    entries = {}
    for name, body in ENTRY.findall(section):
        seams = body.partition("Seams:")[2]
        entries[name] = re.findall(r"`([\w.]+)`", seams)
    return entries


def packages_in_tree() -> set[str]:
    return {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def protocols_in_tree() -> set[tuple[str, str]]:
    """(package, module.Class) of every class that subclasses typing.Protocol."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", None)) == "Protocol" for b in node.bases
            ):
                package = ".".join(path.parent.relative_to(REPO).parts)
                found.add((package, f"{path.stem}.{node.name}"))
    return found


def test_every_package_has_an_entry_and_every_entry_a_package():
    named = set(package_map())
    tree = packages_in_tree()
    assert tree - named == set(), "packages missing from the map"
    assert named - tree == set(), "the map names packages that are gone"


@pytest.mark.parametrize("package,seam", sorted(protocols_in_tree()))
def test_every_protocol_is_a_named_seam(package, seam):
    assert seam in package_map().get(package, []), f"{package}: {seam} is not in the map"


def test_every_named_seam_exists():
    missing = []
    for package, seams in package_map().items():
        for seam in seams:
            module, _, name = seam.rpartition(".")
            try:
                target = importlib.import_module(f"{package}.{module}" if module else package)
            except ImportError as e:
                missing.append(f"{package}: {seam} ({e})")
                continue
            if not hasattr(target, name):
                missing.append(f"{package}: {seam}")
    assert missing == []
