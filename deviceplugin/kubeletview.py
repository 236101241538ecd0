"""kubelet's own records of which container got which device, read on the node.

Two sources, both kubelet's:

- the **PodResources API** v1 (``List`` on kubelet's unix socket,
  ``/var/lib/kubelet/pod-resources/kubelet.sock`` on a real node): pod/container -> device IDs,
  answered from kubelet's device manager;
- kubelet's **device checkpoint** (``kubelet_internal_checkpoint`` in the device plugin
  directory): per pod UID and container, the device IDs kubelet allocated and the device plugin's
  ``ContainerAllocateResponse`` kept as kubelet received it, i.e. what the plugin answered.

Guarantees: a socket that is missing or does not answer within the timeout, and a checkpoint
that is missing or does not parse, raise ``KubeletViewError`` (user-facing, one line) naming the
path; nothing is written.  Not guaranteed: kubelet's checkpoint checksum is not verified (kubelet
computes it over Go's in-memory form), so a hand-edited checkpoint is read as it stands.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from handoff.audit import KubeletPod, PluginAnswer, answered_gpus
from proto import deviceplugin_v1beta1_pb2 as dp_pb
from proto import podresources_v1_pb2 as pr_pb
from proto import podresources_v1_pb2_grpc as pr_grpc

POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
KUBELET_CHECKPOINT = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
DEFAULT_TIMEOUT_S = 5.0
Listed = list[KubeletPod]  # kubelet's List answer (a name: ``PodResources.list`` hides ``list``)


class KubeletViewError(Exception):
    """kubelet's record could not be read."""

    user_facing = True


def list_pod_resources(
    socket: Path, *, resource: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[KubeletPod]:
    """kubelet's PodResources ``List``: every pod it lists, with each listed container's device
    IDs of ``resource`` (other resources are left out)."""
    if not socket.exists():
        raise KubeletViewError(f"kubelet's PodResources socket {socket} does not exist")
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)
            response = stub.List(pr_pb.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise KubeletViewError(
            f"PodResources List on {socket} failed: {code.name if code else 'error'}: {details}"
        ) from exc
    return pods_from_list(response, resource=resource)


class PodResources:
    """kubelet's PodResources ``List`` for the device plugin's Allocate path, over one grpc.aio
    channel kept open while the socket file it was opened on stays the same.

    gRPC keeps a channel whose peer went away in its reconnect back-off (seconds, growing with
    every failed try, up to two minutes), and fails each call at once meanwhile; a kubelet that
    restarts makes a new socket file, so the channel is opened again as soon as the socket's
    identity (``socket_identity``) changes, and after any failed call.  A call that fails on a
    channel opened before it is made once more on a fresh channel, waiting for the connection
    within the same ``timeout_s``.

    Guarantees: ``list`` returns kubelet's answer or raises ``KubeletViewError`` (socket
    missing, kubelet not answering within ``timeout_s``); it never answers from an old copy.
    """

    def __init__(self, socket: Path, *, resource: str, timeout_s: float = 2.0) -> None:
        self.socket = socket
        self._resource = resource
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._opened_on = ""  # the socket's identity when ``_channel`` was opened

    def exists(self) -> bool:
        """Whether kubelet's PodResources socket is there (a kubelet, live or dead, made it)."""
        return self.socket.exists()

    async def _fresh_channel(self, identity: str) -> grpc.aio.Channel:
        await self.close()
        self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
        self._opened_on = identity
        return self._channel

    async def list(self, *, resource: str | None = None) -> list[KubeletPod]:
        """Every pod kubelet lists now, with each listed container's devices of ``resource``
        (default: the one given at construction)."""
        if not self.socket.exists():
            raise KubeletViewError(f"kubelet's PodResources socket {self.socket} does not exist")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        identity = socket_identity(self.socket)
        channel = self._channel
        reused = channel is not None and identity == self._opened_on
        if channel is None or not reused:
            channel = await self._fresh_channel(identity)
        try:
            response = await pr_grpc.PodResourcesListerStub(channel).List(
                pr_pb.ListPodResourcesRequest(), timeout=self._timeout_s, wait_for_ready=not reused
            )
        except grpc.aio.AioRpcError as exc:
            left = deadline - loop.time()
            if not reused or left <= 0:
                await self.close()  # no back-off carried into the next call
                raise _list_error(self.socket, exc) from exc
            # the kept channel may be in gRPC's reconnect back-off: once more on a new one
            channel = await self._fresh_channel(socket_identity(self.socket))
            try:
                response = await pr_grpc.PodResourcesListerStub(channel).List(
                    pr_pb.ListPodResourcesRequest(), timeout=left, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as again:
                await self.close()
                raise _list_error(self.socket, again) from again
        return pods_from_list(response, resource=resource or self._resource)

    async def list_seen(self, *, resource: str | None = None) -> tuple[Listed, str]:
        """``list`` and which kubelet answered: its socket file's identity (device, inode,
        change time), the same before and after the call; "" when the socket changed meanwhile
        (kubelet restarted: the answer may be either kubelet's)."""
        before = socket_identity(self.socket)
        listed = await self.list(resource=resource)
        after = socket_identity(self.socket)
        return listed, before if before == after else ""

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None
            self._opened_on = ""


def _list_error(socket: Path, exc: grpc.aio.AioRpcError) -> KubeletViewError:
    return KubeletViewError(
        f"PodResources List on {socket} failed: {exc.code().name}: {exc.details()}"
    )


def socket_identity(socket: Path) -> str:
    """Which file ``socket`` is now (device, inode, change time in ns); "" when it is missing.
    kubelet removes its PodResources socket and makes a new one when it starts."""
    try:
        st = os.stat(socket)
    except OSError:
        return ""
    return f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}"


def pods_from_list(response: pr_pb.ListPodResourcesResponse, *, resource: str) -> list[KubeletPod]:
    """The plain-data form of a ``ListPodResourcesResponse`` (kubelet sends one entry per device
    and NUMA node; they are merged per container)."""
    out: list[KubeletPod] = []
    for pod in response.pod_resources:
        containers: dict[str, frozenset[str]] = {}
        for c in pod.containers:
            ids: set[str] = set(containers.get(c.name, frozenset()))
            for dev in c.devices:
                if dev.resource_name == resource:
                    ids.update(dev.device_ids)
            containers[c.name] = frozenset(ids)
        out.append(KubeletPod(pod.namespace, pod.name, containers))
    return out


def read_checkpoint(path: Path, *, resource: str) -> list[PluginAnswer]:
    """The plugin's answers for ``resource`` as kubelet's device checkpoint keeps them."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise KubeletViewError(f"kubelet's device checkpoint {path} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise KubeletViewError(f"kubelet's device checkpoint {path} is unreadable: {exc}") from exc
    try:
        return answers_from_checkpoint(raw, resource=resource)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise KubeletViewError(
            f"kubelet's device checkpoint {path} is not in the expected form: {exc}"
        ) from exc


def answers_from_checkpoint(raw: Any, *, resource: str) -> list[PluginAnswer]:
    """Parse kubelet's checkpoint JSON (``Data.PodDeviceEntries``: ``PodUID``,
    ``ContainerName``, ``ResourceName``, ``DeviceIDs`` per NUMA node, ``AllocResp`` as base64 of
    the protobuf ``ContainerAllocateResponse``); raises ``ValueError`` on anything unexpected."""
    entries = raw["Data"]["PodDeviceEntries"] or []
    if not isinstance(entries, list):
        raise ValueError("Data.PodDeviceEntries is not a list")
    out: list[PluginAnswer] = []
    for entry in entries:
        if entry["ResourceName"] != resource:
            continue
        per_numa = entry.get("DeviceIDs") or {}
        if not isinstance(per_numa, dict):
            raise ValueError(f"DeviceIDs of {entry['PodUID']}/{entry['ContainerName']}")
        kubelet_ids = frozenset(str(d) for ids in per_numa.values() for d in ids or ())
        response = dp_pb.ContainerAllocateResponse()
        encoded = entry.get("AllocResp")
        if encoded:
            try:
                response.ParseFromString(base64.b64decode(encoded, validate=True))
            except (binascii.Error, DecodeError) as exc:
                raise ValueError(
                    f"AllocResp of {entry['PodUID']}/{entry['ContainerName']}: {exc}"
                ) from exc
        answered = answered_gpus(
            dict(response.envs), [d.name for d in response.cdi_devices], resource=resource
        )
        out.append(
            PluginAnswer(str(entry["PodUID"]), str(entry["ContainerName"]), kubelet_ids, answered)
        )
    return out
