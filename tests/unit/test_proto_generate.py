"""The committed generated modules are exactly what ``python -m proto.generate`` produces."""

from __future__ import annotations

from pathlib import Path

from proto import generate


def test_regenerating_gives_identical_files(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(generate.generated_names())
    stale = []
    for path in written:
        committed = generate.PROTO_DIR / path.name
        if not committed.exists() or committed.read_bytes() != path.read_bytes():
            stale.append(path.name)
    assert not stale, f"generated files differ; run `python -m proto.generate`: {stale}"


def test_every_proto_file_is_generated() -> None:
    on_disk = sorted(p.name for p in generate.PROTO_DIR.glob("*.proto"))
    assert on_disk == sorted(generate.PROTO_FILES)
