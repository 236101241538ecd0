"""kube-scheduler's configuration for the extender: the function, the shipped file, the chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler_ext.config import MIG_PROFILES, ExtenderTLS, extender_entry, scheduler_config

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
CHART_RENDERED = ROOT / "deploy" / "manifests" / "50-scheduler.yaml"


def test_scheduler_config_for_devcluster() -> None:
    config = scheduler_config("http://127.0.0.1:8888/", kubeconfig="/tmp/sched.kubeconfig")
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["clientConnection"] == {"kubeconfig": "/tmp/sched.kubeconfig"}
    assert config["leaderElection"] == {"leaderElect": False}
    (entry,) = config["extenders"]
    assert entry == {
        "urlPrefix": "http://127.0.0.1:8888",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": 5,
        "enableHTTPS": False,
        "httpTimeout": "10s",
        "nodeCacheCapable": True,
        "managedResources": [
            {"name": "nvidia.com/gpu", "ignoredByScheduler": False},
            {"name": "nvidia.com/gpumem", "ignoredByScheduler": True},
            {"name": "nvidia.com/gpumem-percentage", "ignoredByScheduler": True},
            {"name": "nvidia.com/gpucores", "ignoredByScheduler": True},
            *({"name": f"nvidia.com/mig-{p}", "ignoredByScheduler": False} for p in MIG_PROFILES),
        ],
        "ignorable": False,
    }
    assert not scheduler_config("http://x:1", kubeconfig="k", node_cache_capable=False)[
        "extenders"
    ][0]["nodeCacheCapable"]


def test_https_entry_carries_tls_config() -> None:
    tls = ExtenderTLS(ca_file="/ca.crt", cert_file="/s.crt", key_file="/s.key", server_name="x")
    entry = extender_entry("https://x:443", tls=tls)
    assert entry["enableHTTPS"] is True
    assert entry["tlsConfig"] == {
        "serverName": "x",
        "certFile": "/s.crt",
        "keyFile": "/s.key",
        "caFile": "/ca.crt",
    }
    with pytest.raises(ValueError, match="https"):
        extender_entry("http://x:80", tls=tls)
    with pytest.raises(ValueError, match="weight"):
        extender_entry("http://x:80", weight=0)


def _only_extender(docs: list[Any]) -> dict[str, Any]:
    for doc in docs:
        if doc and doc.get("kind") == "KubeSchedulerConfiguration":
            (entry,) = doc["extenders"]
            return dict(entry)
        if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            return _only_extender([yaml.safe_load(doc["data"]["config.yaml"])])
    raise AssertionError("no KubeSchedulerConfiguration found")


def test_shipped_file_is_what_the_function_renders() -> None:
    entry = _only_extender([yaml.safe_load(SHIPPED.read_text())])
    tls = ExtenderTLS(
        ca_file="/etc/kubernetes/pki/nodelock/ca.crt",
        cert_file="/etc/kubernetes/pki/nodelock/scheduler.crt",
        key_file="/etc/kubernetes/pki/nodelock/scheduler.key",
        server_name="nodelock-extender.nodelock-system.svc",
    )
    assert entry == extender_entry("https://nodelock-extender.nodelock-system.svc:443", tls=tls)


def test_chart_uses_the_protocol_settings_the_extender_expects() -> None:
    # the rendered manifests are committed (`make generate`): a renamed file fails here, it
    # does not skip
    assert CHART_RENDERED.is_file(), f"{CHART_RENDERED.relative_to(ROOT)} is missing"
    chart = _only_extender(list(yaml.safe_load_all(CHART_RENDERED.read_text())))
    ours = extender_entry("https://x", tls=ExtenderTLS())
    for key in ("filterVerb", "prioritizeVerb", "bindVerb", "nodeCacheCapable", "ignorable"):
        assert chart[key] == ours[key], key
    assert chart["managedResources"] == ours["managedResources"]
