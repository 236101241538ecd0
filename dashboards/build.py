"""Generate nodelock's Grafana dashboards: ``python -m dashboards.build [--check]``.

Writes ``dashboards/overview.json`` and ``dashboards/node.json``; ``--check`` exits 1 when either
differs from what the code generates (a unit test runs it).  Why generated and not hand-edited
JSON: ``dashboards/README.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dashboards import node, overview
from dashboards.grafana import JSON

HERE = Path(__file__).resolve().parent
DASHBOARDS: dict[str, Callable[[], JSON]] = {
    "overview.json": overview.model,
    "node.json": node.model,
}


def render(model: JSON) -> str:
    return json.dumps(model, indent=2, sort_keys=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    for name, make in DASHBOARDS.items():
        path = HERE / name
        text = render(make())
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        elif not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run `python -m dashboards.build`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
