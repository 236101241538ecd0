"""The repository stands alone: no doc, code comment or manifest points to a document outside it
(the developers' shared design notes), and the design contract itself is in ``docs/design.md``
with every section other pages point to."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "build", "dist", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".tpl", ".go", ".toml", ".txt", ".sh"}

# "DESIGN.md", "DESIGN §3.2", "DESIGN section 4", "DESIGN's", "../shared/...", "/work/shared"
OUTSIDE = re.compile(r"\bDESIGN(\.md|\s*§|\s+section|'s)|\.\./shared/|/work/shared")


def _text_files() -> list[Path]:
    found = []
    for path in REPO_ROOT.rglob("*"):
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in path.parts):
            continue
        if path.is_file() and (path.suffix in SUFFIXES or path.name == "Containerfile"):
            found.append(path)
    return found


def test_nothing_points_to_a_document_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    hits = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in _text_files()
        if path.resolve() != this
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, "point to docs/design.md instead:\n" + "\n".join(hits)


def test_design_has_the_sections_other_pages_point_to() -> None:
    design = (REPO_ROOT / "docs" / "design.md").read_text()
    headings = {
        re.sub(r"^[\d.]+\s+", "", h).strip()
        for h in re.findall(r"^#{2,3}\s+(.+)$", design, flags=re.MULTILINE)
    }
    cited: set[str] = set()
    for path in _text_files():
        text = path.read_text(errors="replace")
        for match in re.finditer(r'design\.md\)?,? \(?"([^"]+)"', text):
            cited.add(" ".join(match.group(1).split()))
    assert cited, "no page points to a section of docs/design.md"
    assert cited <= headings, f"sections cited but missing: {sorted(cited - headings)}"


def test_license_and_project_metadata_agree() -> None:
    license_text = (REPO_ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert re.search(r'^license = "Apache-2\.0"$', pyproject, flags=re.MULTILINE)
