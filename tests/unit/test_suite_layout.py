"""The suite collects as one pytest run: no two test files share a module name.

The test folders have no ``__init__.py`` (pytest's rootdir-relative import), so two files named
alike in two folders stop the whole run at collection with "import file mismatch".
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}
