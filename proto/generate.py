"""Generate the Python modules of the ``.proto`` files in this directory.

``python -m proto.generate`` (or ``make proto``) rewrites, next to each ``<name>.proto``:
``<name>_pb2.py`` (messages), ``<name>_pb2_grpc.py`` (gRPC stubs and servicers) and their typed
interfaces ``<name>_pb2.pyi`` / ``<name>_pb2_grpc.pyi`` (mypy-protobuf).  The generated files are
committed; ``tests/unit/test_proto_generate.py`` regenerates them into a temporary directory and
fails when they differ, so the stubs cannot drift from the ``.proto`` files or the toolchain.

Needs the ``dev`` extra (grpcio-tools, mypy-protobuf).  Output depends only on the ``.proto``
files and the versions of those tools, which ``pyproject.toml`` and ``constraints.txt`` pin; to
move to newer ones, raise both pins, reinstall (``make setup``) and commit what this writes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
PROTO_FILES = ("deviceplugin_v1beta1.proto", "podresources_v1.proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


class GenerationError(RuntimeError):
    """protoc failed or a code generator plugin is missing."""

    user_facing = True


def _plugin(name: str) -> str:
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        raise GenerationError(f"{name} not found: install the dev extra (mypy-protobuf)")
    return found


def generated_names() -> list[str]:
    """Names (relative to ``proto/``) of every file this command writes."""
    return [Path(p).stem + s for p in PROTO_FILES for s in GENERATED_SUFFIXES]


def generate(out_root: Path) -> list[Path]:
    """Generate into ``out_root/proto/``; returns the files written."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise GenerationError("grpcio-tools is not installed: install the dev extra") from exc
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"--proto_path={REPO_ROOT}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *(f"{PROTO_DIR.name}/{name}" for name in PROTO_FILES),
    ]
    code = protoc.main(args)
    if code != 0:
        raise GenerationError(f"protoc failed with exit code {code}")
    return [out_root / PROTO_DIR.name / name for name in generated_names()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proto.generate", description=__doc__)
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT,
        help="root to write proto/*_pb2*.py into (default: the repository, in place)",
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
