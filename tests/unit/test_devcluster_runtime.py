"""The pure parts of devcluster's containerd nodes: the node network's numbering, the cluster
DNS's packets, the nodes' configurations and the image key."""

from __future__ import annotations

import ipaddress
import json
import struct
from pathlib import Path

import pytest

from devcluster.clusterdns import (
    RCODE_NXDOMAIN,
    TYPE_A,
    answer,
    parse_query,
    service_of,
)
from devcluster.errors import DevclusterError
from devcluster.images import CONTAINERFILE, IMAGE_PACKAGES, Image, context_files, nodelock_key
from devcluster.netns import MAX_NODES, NodeNetwork, free_index
from devcluster.runtime import (
    CDI_ENV_PREFIX,
    cdi_spec,
    cni_config,
    containerd_config,
    kubelet_config,
    node_list,
)
from deviceplugin.answer import DeviceMode, container_answer
from deviceplugin.simulated import SimSpec, inventory


def test_node_addresses_pod_ranges_and_names_never_overlap() -> None:
    net = NodeNetwork(7, 6443)
    subnet = ipaddress.ip_network(net.subnet)
    ips = [ipaddress.ip_address(net.node_ip(i)) for i in range(MAX_NODES)]
    assert len(set(ips)) == MAX_NODES
    assert all(ip in subnet for ip in ips)
    assert ipaddress.ip_address(net.gateway) in subnet
    assert ipaddress.ip_address(net.gateway) not in ips
    ranges = [ipaddress.ip_network(net.pod_cidr(i)) for i in range(MAX_NODES)]
    for i, a in enumerate(ranges):
        assert not a.overlaps(subnet)
        assert not any(a.overlaps(b) for b in ranges[i + 1 :])
    assert all(len(net.host_veth(i)) <= 15 for i in range(MAX_NODES))  # IFNAMSIZ - 1
    with pytest.raises(ValueError, match="outside"):
        net.node_ip(MAX_NODES)


def test_the_free_index_skips_taken_bridges_and_routed_subnets() -> None:
    assert free_index([], []) == 1
    assert free_index(["nlbr1"], []) == 2
    assert free_index(["nlbr1"], ["10.200.2.0/24", "default"]) == 3
    with pytest.raises(DevclusterError, match="no free node network"):
        free_index([], ["10.200.0.0/16"])


def test_the_dnat_rule_takes_the_bridge_port_to_loopback() -> None:
    rule = NodeNetwork(3, 41234).dnat_rule()
    assert rule[:3] == ["PREROUTING", "-i", "nlbr3"]
    assert rule[-1] == "127.0.0.1:41234"
    assert "10.200.3.1" in rule


def _query(name: str, qtype: int = TYPE_A, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def test_a_service_name_is_answered_with_its_cluster_ip() -> None:
    q = parse_query(_query("Nodelock-Extender.nodelock-system.svc.cluster.local"))
    assert q is not None
    assert service_of(q.name) == ("nodelock-system", "nodelock-extender")
    out = answer(q, "10.0.0.17", known=True)
    ident, flags, qd, an, _, _ = struct.unpack_from("!HHHHHH", out)
    assert (ident, qd, an) == (0x1234, 1, 1)
    assert flags & 0x8000  # a response
    assert flags & 0x0400  # authoritative
    assert flags & 0x000F == 0  # no error
    assert out.endswith(ipaddress.IPv4Address("10.0.0.17").packed)


def test_other_names_are_nxdomain_and_other_types_get_no_record() -> None:
    q = parse_query(_query("example.com"))
    assert q is not None
    assert service_of(q.name) is None
    assert struct.unpack_from("!H", answer(q, None, known=False), 2)[0] & 0x000F == RCODE_NXDOMAIN
    aaaa = parse_query(_query("x.default.svc.cluster.local", qtype=28))
    assert aaaa is not None
    out = answer(aaaa, "10.0.0.1", known=True)
    assert struct.unpack_from("!HH", out, 2)[0] & 0x000F == 0
    assert struct.unpack_from("!H", out, 6)[0] == 0  # no answer record


@pytest.mark.parametrize(
    "packet",
    [b"", b"\x00" * 11, _query("a.b.svc.cluster.local")[:-2], b"\x12\x34\x81\x00" + b"\0" * 8],
)
def test_what_is_not_one_standard_query_is_dropped(packet: bytes) -> None:
    assert parse_query(packet) is None


def test_a_node_keeps_its_runtime_and_network_under_its_own_directory(tmp_path: Path) -> None:
    net = NodeNetwork(4, 6443)
    system, gpu = node_list(tmp_path, 1)
    assert (system.name, system.gpus, gpu.name, gpu.gpus) == (
        "node-system",
        False,
        "gpu-node-01",
        True,
    )
    toml = containerd_config(gpu, sandbox_image="localhost/pause:1")
    assert f'address = "{gpu.containerd_socket}"' in toml
    assert "restrict_oom_score_adj = true" in toml
    assert 'sandbox_image = "localhost/pause:1"' in toml
    assert "enable_cdi = true" in toml
    assert 'cdi_spec_dirs = ["/etc/cdi"]' in toml
    cni = json.loads(json.dumps(cni_config(gpu, net)))
    assert cni["plugins"][0]["ipam"]["ranges"] == [[{"subnet": net.pod_cidr(1)}]]
    assert cni["plugins"][0]["ipam"]["dataDir"].startswith(str(gpu.root))
    kubelet = kubelet_config(gpu, net, ca_file=tmp_path / "ca.crt")
    assert kubelet["address"] == net.node_ip(1)
    assert kubelet["clusterDNS"] == [net.gateway]
    assert kubelet["containerRuntimeEndpoint"] == f"unix://{gpu.containerd_socket}"
    assert kubelet["cgroupsPerQOS"] is False
    assert "podLogsDir" not in kubelet


def test_the_image_key_follows_every_file_the_containerfile_copies(tmp_path: Path) -> None:
    files = context_files()
    copied = {f.relative_to(CONTAINERFILE.parents[1]).parts[0] for f in files}
    assert set(IMAGE_PACKAGES) <= copied
    assert all("__pycache__" not in f.parts for f in files)
    base = Image("localhost/nodelock-base:x", tmp_path / "base.tar")
    assert nodelock_key(base) == nodelock_key(base)
    assert nodelock_key(base, revision="upgrade") != nodelock_key(base)
    other = Image("localhost/nodelock-base:y", tmp_path / "base.tar")
    assert nodelock_key(other) != nodelock_key(base)


def test_the_cdi_spec_resolves_every_name_the_plugin_answers_for_its_simulated_gpus() -> None:
    gpus = inventory("gpu-node-02", SimSpec(count=3))
    spec = cdi_spec("gpu-node-02", 3)
    names = {f"{spec['kind']}={d['name']}": d for d in spec["devices"]}
    for gpu in gpus:
        (cdi,) = container_answer([gpu.id], mode=DeviceMode.CDI).cdi_devices
        assert names[cdi]["containerEdits"]["env"] == [f"{CDI_ENV_PREFIX}{gpu.index}={gpu.id}"]
    assert len(names) == len(gpus) == 3
    other = cdi_spec("gpu-node-01", 3)["devices"][0]["name"]
    assert other not in {d["name"] for d in spec["devices"]}
