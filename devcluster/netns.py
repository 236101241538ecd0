"""The network of devcluster's containerd nodes: one bridge on this machine, one network
namespace per node, as kind gives each node a container on a bridge.

A cluster's network is numbered by ``index`` (1-249, free among the bridges present): the bridge
``nlbr<index>`` holds ``10.200.<index>.1/24``; node ``i`` (from 0) is the network namespace
``nl<index>-<i>`` whose ``eth0`` holds ``10.200.<index>.<10+i>`` and whose pods take
``10.<201+i>.<index>.0/24`` (CNI bridge ``cni0`` inside the namespace, masquerading what leaves
for other addresses).  Each node routes the other nodes' pod ranges to them over the bridge, so
pods reach each other without this machine forwarding anything (``net.ipv4.ip_forward`` stays as
it is).  kube-apiserver keeps listening on 127.0.0.1: a DNAT rule for packets that come in on the
bridge (with ``route_localnet`` on the bridge alone) takes ``10.200.<index>.1:<port>`` to it.

Every address is inside namespaces and a bridge this module creates, and nothing is routed
anywhere else.  ``teardown`` removes all of it (idempotent: what is already gone is skipped).
Needs root and ``ip``, ``iptables`` (``make runtime-deps``).
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from devcluster.errors import DevclusterError

MAX_NODES = 50  # pod ranges 10.201.x to 10.250.x
FIRST_NODE_HOST = 10


@dataclass(frozen=True)
class NodeNetwork:
    """The addresses of one cluster's node network (see the module docstring)."""

    index: int
    apiserver_port: int

    def __post_init__(self) -> None:
        if not 1 <= self.index <= 249:
            raise ValueError(f"network index {self.index} is outside 1-249")

    @property
    def bridge(self) -> str:
        return f"nlbr{self.index}"

    @property
    def gateway(self) -> str:
        """This machine's address on the bridge: the API server and cluster DNS are reached here."""
        return f"10.200.{self.index}.1"

    @property
    def subnet(self) -> str:
        return f"10.200.{self.index}.0/24"

    def netns(self, i: int) -> str:
        return f"nl{self.index}-{i}"

    def node_ip(self, i: int) -> str:
        _check_node(i)
        return f"10.200.{self.index}.{FIRST_NODE_HOST + i}"

    def pod_cidr(self, i: int) -> str:
        _check_node(i)
        return f"10.{201 + i}.{self.index}.0/24"

    def host_veth(self, i: int) -> str:
        return f"nlv{self.index}-{i}"

    def dnat_rule(self) -> list[str]:
        """The nat PREROUTING rule taking the bridge's API server port to 127.0.0.1."""
        return [
            "PREROUTING",
            "-i",
            self.bridge,
            "-d",
            self.gateway,
            "-p",
            "tcp",
            "--dport",
            str(self.apiserver_port),
            "-j",
            "DNAT",
            "--to-destination",
            f"127.0.0.1:{self.apiserver_port}",
        ]

    def to_settings(self) -> dict[str, Any]:
        return {"index": self.index, "apiserver_port": self.apiserver_port}

    @classmethod
    def from_settings(cls, data: dict[str, Any]) -> NodeNetwork:
        return cls(int(data["index"]), int(data["apiserver_port"]))


def _check_node(i: int) -> None:
    if not 0 <= i < MAX_NODES:
        raise ValueError(f"node index {i} is outside 0-{MAX_NODES - 1}")


def free_index(used_bridges: Sequence[str], used_routes: Sequence[str]) -> int:
    """The lowest network index whose bridge does not exist and whose subnet no route covers."""
    taken = set(used_bridges)
    networks = []
    for r in used_routes:
        try:
            networks.append(ipaddress.ip_network(r, strict=False))
        except ValueError:
            continue
    for index in range(1, 250):
        net = NodeNetwork(index, 0)
        mine = ipaddress.ip_network(net.subnet)
        if net.bridge in taken or any(mine.overlaps(n) for n in networks if n.version == 4):
            continue
        return index
    raise DevclusterError("no free node network: 249 devcluster bridges exist")


def _ip(*args: str, check: bool = True) -> str:
    return run(["ip", *args], check=check)


def run(argv: Sequence[str], *, check: bool = True) -> str:
    """Run a network command; a failure is a ``DevclusterError`` naming it (``check``)."""
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevclusterError(f"`{' '.join(argv)}` failed: {exc}") from exc
    if check and res.returncode != 0:
        raise DevclusterError(f"`{' '.join(argv)}` failed: {res.stderr.strip()}")
    return res.stdout


def in_netns(ns: str, argv: Sequence[str], *, check: bool = True) -> str:
    return run(["ip", "netns", "exec", ns, *argv], check=check)


def allocate(apiserver_port: int, owner: str) -> NodeNetwork:
    """A node network with a free index, its bridge (its alias naming ``owner``, the cluster's
    state directory) and DNAT rule created."""
    for _ in range(3):  # another cluster may take the index between the look and the add
        links = _ip("-br", "link", "show", "type", "bridge").splitlines()
        bridges = [line.split()[0] for line in links if line]
        routes = [line.split()[0] for line in _ip("-4", "route", "show").splitlines() if line]
        net = NodeNetwork(free_index(bridges, routes), apiserver_port)
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
        except DevclusterError:
            continue
        break
    else:
        raise DevclusterError("no node network could be created: three indexes taken meanwhile")
    _ip("link", "set", net.bridge, "alias", owner)
    _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
    _ip("link", "set", net.bridge, "up")
    run(["sysctl", "-qw", f"net.ipv4.conf.{net.bridge}.route_localnet=1"])
    run(["iptables", "-t", "nat", "-A", *net.dnat_rule()])
    return net


def bridge_owner(bridge: str) -> str | None:
    """The alias of ``bridge`` (the state directory of the cluster that made it), "" when it has
    none, None when there is no such bridge."""
    try:
        out = _ip("-d", "link", "show", "dev", bridge)
    except DevclusterError:
        return None
    for line in out.splitlines():
        words = line.split(maxsplit=1)
        if len(words) == 2 and words[0] == "alias":
            return words[1].strip()
    return ""


def add_node(net: NodeNetwork, i: int, nodes: int) -> None:
    """Node ``i``'s namespace, its link to the bridge, its address, and routes to the pod ranges
    of the ``nodes`` nodes."""
    ns, veth = net.netns(i), net.host_veth(i)
    run(["ip", "netns", "add", ns])
    _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
    _ip("link", "set", f"{veth}p", "netns", ns)
    _ip("link", "set", veth, "master", net.bridge, "up")
    in_netns(ns, ["ip", "link", "set", f"{veth}p", "name", "eth0"])
    in_netns(ns, ["ip", "addr", "add", f"{net.node_ip(i)}/24", "dev", "eth0"])
    in_netns(ns, ["ip", "link", "set", "eth0", "up"])
    in_netns(ns, ["ip", "link", "set", "lo", "up"])
    in_netns(ns, ["ip", "route", "add", "default", "via", net.gateway])
    in_netns(ns, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    for j in range(nodes):
        if j != i:
            in_netns(ns, ["ip", "route", "add", net.pod_cidr(j), "via", net.node_ip(j)])


def teardown(net: NodeNetwork, nodes: int, owner: str) -> None:
    """Remove the namespaces, the bridge and the DNAT rule (what is gone already is skipped).
    A network whose bridge another cluster made (its alias names another state directory: the
    index was free again and taken since ``owner`` stopped) is left alone."""
    made_by = bridge_owner(net.bridge)
    if made_by not in (None, "", owner):
        return
    for i in range(nodes):
        run(["ip", "netns", "del", net.netns(i)], check=False)
        _ip("link", "del", net.host_veth(i), check=False)
    run(["iptables", "-t", "nat", "-D", *net.dnat_rule()], check=False)
    _ip("link", "del", net.bridge, check=False)
