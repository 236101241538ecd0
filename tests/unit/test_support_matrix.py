"""The support matrix is read from the test markers: what is marked ``core`` is what it lists."""

from __future__ import annotations

from pathlib import Path

from devcluster.versions import RELEASES, resolve
from tests.support import core_tests, render

MARKED = """
import pytest

@pytest.mark.core
async def test_marked(e2e): ...

@pytest.mark.parametrize("x", [1])
@pytest.mark.core
def test_marked_under_another_mark(x): ...

async def test_not_marked(e2e): ...

@pytest.mark.e2e
def test_other_mark(): ...
"""

MODULE = """
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.core]

def test_one(): ...
def helper(): ...
"""


def test_only_functions_marked_core_are_listed(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(MARKED)
    (tmp_path / "test_b.py").write_text(MODULE)
    (tmp_path / "kit.py").write_text(MARKED)  # not a test file
    found = core_tests(tmp_path, root=tmp_path)
    assert found == [
        "test_a.py::test_marked",
        "test_a.py::test_marked_under_another_mark",
        "test_b.py::test_one",
    ]


def test_every_release_has_a_row_and_the_oldest_runs_the_core() -> None:
    text = render()
    for tag in RELEASES.values():
        assert f"| {tag} |" in text
    oldest = resolve("oldest").tag
    row = next(line for line in text.splitlines() if f"| {oldest} |" in line)
    assert f"the {len(core_tests())} tests marked `core`" in row
