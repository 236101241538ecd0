"""What a devcluster state directory holds, so that ``up`` resumes only the cluster it was.

``up`` keeps etcd's data in the state directory: Node objects, pods and Leases survive a
``down``/``up``.  Resuming them under another shape (other node count, GPUs per node, GPU
layout, sharing, GPU memory or MIG layouts) leaves Nodes whose simulated kubelet no longer runs,
or serves other devices, and pods bound to them.  So ``up`` records the shape (``shape.json``) and
refuses to resume data of another shape, or data from a version that recorded none, naming
``nodelock devcluster down --purge``.

Guarantees: ``check_resume`` is pure (plain data in, ``DevclusterError`` out); ``purge`` removes
only a directory that holds a devcluster's files (never an arbitrary path given by mistake).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from devcluster.errors import DevclusterError

SHAPE_FILE = "shape.json"
SHAPE_FORMAT = 1  # bump when what a state directory holds changes incompatibly
MARKERS = ("state.json", SHAPE_FILE, "etcd", "pki")  # what makes a directory a devcluster's


@dataclass(frozen=True)
class Shape:
    """What the objects in etcd were made for."""

    nodes: int
    gpus_per_node: int
    gpu_topology: str | None = None
    gpu_split: int = 1  # the split of the sharing nodes (1: none shares)
    shared_nodes: int = 0  # how many nodes (the last ones) share their GPUs
    mig: str = ""  # the MIG layouts, ``mig_layouts`` of the --mig values ("": no MIG)
    gpu_memory_mib: int | None = None  # --gpu-memory-mib (None: the simulated default)

    def describe(self) -> str:
        if not self.nodes:
            return "a control plane without GPU nodes"
        layout = f", GPU topology {self.gpu_topology}" if self.gpu_topology else ""
        sharing = (
            f", {self.shared_nodes} of them sharing each GPU {self.gpu_split} ways"
            if self.shared_nodes and self.gpu_split > 1
            else ""
        )
        memory = f", {self.gpu_memory_mib} MiB per GPU" if self.gpu_memory_mib else ""
        mig = f", MIG {self.mig}" if self.mig else ""
        return f"{self.nodes} GPU nodes x {self.gpus_per_node} GPUs{layout}{sharing}{memory}{mig}"


def mig_layouts(pairs: Sequence[tuple[int, str]]) -> str:
    """The MIG part of a shape: ``INDEX=LAYOUT`` per GPU, by index ("" for none)."""
    return " ".join(f"{index}={layout}" for index, layout in sorted(pairs))


def shape_record(shape: Shape) -> dict[str, Any]:
    return {"format": SHAPE_FORMAT, **asdict(shape)}


def check_resume(
    recorded: dict[str, Any] | None, *, has_data: bool, wanted: Shape, state_dir: Path
) -> None:
    """Raise ``DevclusterError`` unless ``up`` with ``wanted`` may resume ``state_dir``, whose
    shape file says ``recorded`` (None: none) and which holds etcd data when ``has_data``."""
    purge = f"`nodelock devcluster down --purge --state-dir {state_dir}`"
    if not has_data:
        return
    if recorded is None:
        raise DevclusterError(
            f"{state_dir} holds cluster data from an older nodelock version that did not record "
            f"its shape, so it cannot be resumed safely; remove it with {purge} and run up again"
        )
    if recorded.get("format") != SHAPE_FORMAT:
        raise DevclusterError(
            f"{state_dir} holds cluster data in format {recorded.get('format')!r}, this version "
            f"reads format {SHAPE_FORMAT}; remove it with {purge} and run up again"
        )
    try:
        old = shape_of(recorded)
    except (KeyError, TypeError, ValueError) as exc:
        raise DevclusterError(
            f"{state_dir}/{SHAPE_FILE} is not readable ({exc!r}); remove the state with {purge}"
        ) from exc
    if old != wanted:
        raise DevclusterError(
            f"{state_dir} holds {old.describe()}; up asks for {wanted.describe()}. Its Node "
            "objects and pods would outlive their simulated kubelets. Run up with the same "
            "--nodes/--gpus-per-node/--gpu-topology/--gpu-split/--shared-nodes/--gpu-memory-mib/"
            f"--mig to resume it, or remove it with {purge}"
        )


def shape_of(recorded: dict[str, Any]) -> Shape:
    """The shape a shape file of this format records; raises ``KeyError``, ``TypeError`` or
    ``ValueError`` for one it does not.  Fields added after the format's first version read
    as their defaults when absent (nothing shared, no MIG, the default GPU memory), which is
    what a cluster recorded before them was made with."""
    memory = recorded.get("gpu_memory_mib")
    mig = recorded.get("mig", "")
    if not isinstance(mig, str):
        raise TypeError(f"mig is {mig!r}, not a string")
    return Shape(
        nodes=int(recorded["nodes"]),
        gpus_per_node=int(recorded["gpus_per_node"]),
        gpu_topology=recorded.get("gpu_topology"),
        gpu_split=int(recorded.get("gpu_split", 1)),
        shared_nodes=int(recorded.get("shared_nodes", 0)),
        mig=mig,
        gpu_memory_mib=None if memory is None else int(memory),
    )


def read_shape(state_dir: Path) -> dict[str, Any] | None:
    """The recorded shape (None when there is none); a corrupt file reads as format None."""
    path = state_dir / SHAPE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return {"format": None}
    return data if isinstance(data, dict) else {"format": None}


def write_shape(state_dir: Path, shape: Shape) -> None:
    (state_dir / SHAPE_FILE).write_text(json.dumps(shape_record(shape)) + "\n")


def has_data(state_dir: Path) -> bool:
    """Whether etcd has written data there (a cluster that was up at least once)."""
    return (state_dir / "etcd" / "member").exists()


def purge(state_dir: Path) -> bool:
    """Remove the state directory (etcd data, certificates, logs); False when there was none.
    Refuses a directory that does not look like a devcluster's."""
    if not state_dir.exists():
        return False
    if not any((state_dir / m).exists() for m in MARKERS):
        raise DevclusterError(
            f"{state_dir} does not look like a devcluster state directory (none of "
            f"{', '.join(MARKERS)}); not removing it"
        )
    shutil.rmtree(state_dir)
    return True
