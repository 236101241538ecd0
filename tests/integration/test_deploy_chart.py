"""The Helm chart and the plain manifests: they agree, the real API server accepts them, and what
they configure is what the parts, the real kube-scheduler and Helm's certificates expect.

Rendering uses the Helm CLI built from its Go module (``devcluster.helm.ensure_helm``); applying
uses the session devcluster's kube-apiserver with server-side dry run, so nothing is created.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import ipaddress
import json
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from devcluster.cluster import Cluster
from devcluster.errors import DevclusterError
from devcluster.helm import (
    CHART_DIR,
    DEVCLUSTER_POLICIES,
    DEVCLUSTER_SETTINGS,
    MANIFEST_ARGS,
    MANIFEST_SETTINGS,
    MANIFESTS_DIR,
    MUTATING_POLICY_API,
    REPO_ROOT,
    alerts_in_step,
    chart_readme,
    devcluster_policies,
    ensure_helm,
    manifest_files,
    render,
)
from deviceplugin import cli as deviceplugin_cli
from handoff.wire import Keys
from scheduler_ext import cli as extender_cli
from scheduler_ext.config import MIG_PROFILES, ExtenderTLS, extender_entry
from tests.integration.deploy_kit import (
    JSON,
    TEST_LABEL,
    apply,
    discovered_apis,
    parse_documents,
)

NS = "nodelock-system"


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_helm()


def objects(helm: Path, *args: str, **settings: str) -> list[JSON]:
    """The chart rendered with ``settings`` (``--set``) and extra ``helm template`` ``args``, as
    for the cluster the plain manifests are for (``MANIFEST_ARGS``: the devcluster's version,
    which serves every API the chart can use); ``args`` come after, so they win."""
    return parse_documents(render(helm, settings=settings, extra_args=(*MANIFEST_ARGS, *args)))


MONITORING_CRDS = (
    "--api-versions=monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions=monitoring.coreos.com/v1/PrometheusRule",
)
CERT_MANAGER_CRDS = ("--api-versions=cert-manager.io/v1/Certificate",)


def find(objs: list[JSON], kind: str, name: str) -> JSON:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} rendered {len(found)} times"
    return found[0]


def container(workload: JSON, name: str) -> JSON:
    spec = workload["spec"]["template"]["spec"]
    [c] = [c for c in spec["containers"] if c["name"] == name]
    result: JSON = c
    return result


# ---- the manifests are the chart --------------------------------------------------------------


def test_manifests_are_the_chart_rendered_with_their_settings(helm: Path) -> None:
    expected = manifest_files(render(helm, settings=MANIFEST_SETTINGS, extra_args=MANIFEST_ARGS))
    on_disk = {p.name: p.read_text() for p in sorted(MANIFESTS_DIR.glob("*.yaml"))}
    assert sorted(on_disk) == sorted(expected), "run `python -m devcluster.helm manifests`"
    for name, text in expected.items():
        assert on_disk[name] == text, f"deploy/manifests/{name} is stale: regenerate it"


def test_devcluster_policies_are_the_charts(helm: Path) -> None:
    """The devcluster applies the chart's GPU pod policies, rendered for its wiring."""
    expected = devcluster_policies(render(helm, settings=DEVCLUSTER_SETTINGS))
    assert DEVCLUSTER_POLICIES.read_text() == expected, "run `python -m devcluster.helm manifests`"
    kinds = [d["kind"] for d in parse_documents(expected)]
    # the devcluster's kube-scheduler is the default one, with the extender: nothing to steer
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    [policy] = [d for d in parse_documents(expected) if d["kind"] == "ValidatingAdmissionPolicy"]
    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    assert any('schedulerName in ["default-scheduler"]' in e for e in expressions), expressions


def test_chart_alert_rules_are_the_dashboards_rules() -> None:
    assert alerts_in_step(), (
        "dashboards/alerts.yaml, dashboards/*.json or values.schema.json changed: "
        "`python -m devcluster.helm manifests`"
    )


def test_committed_chart_readme_is_the_one_generated_from_the_schema() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    assert readme == chart_readme((CHART_DIR / "values.schema.json").read_text()), (
        "deploy/helm/nodelock/README.md is stale: `python -m devcluster.helm manifests`"
    )
    # every value a user sets by hand has its row
    for key in ("global.imageRegistry", "extender.metricsPort", "tls.certManager.issuerRef"):
        assert f"| `{key}` |" in readme, key


def test_chart_passes_helm_lint_with_strict_checks(helm: Path) -> None:
    res = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_manifests_apply_with_server_side_dry_run(cluster: Cluster) -> None:
    # as docs/install.md says: every file, but 25-admission-scheduler-name.yaml only where the
    # cluster serves MutatingAdmissionPolicy v1
    files = sorted(MANIFESTS_DIR.glob("*.yaml"))
    if MUTATING_POLICY_API not in discovered_apis(cluster):
        files = [p for p in files if p.name != "25-admission-scheduler-name.yaml"]
    out = cluster.kubectl("apply", "--dry-run=server", *(a for p in files for a in ("-f", str(p))))
    lines = [line for line in out.splitlines() if line.strip()]
    count = sum(len(parse_documents(p.read_text())) for p in files)
    assert len(lines) == count, out
    assert all(line.endswith("(server dry run)") for line in lines), out


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({}, id="defaults"),
        pytest.param(
            {
                "tls.requireClientCert": "false",
                "devicePlugin.backend": "simulated",
                "devicePlugin.deviceMode": "device-nodes",
                "metrics.service.enabled": "true",
                "lockNamespace": "kube-node-lease",
            },
            id="tls-without-client-certs-simulated-metrics",
        ),
        pytest.param(
            {"tls.enabled": "false", "scheduler.enabled": "false", "admission.enabled": "false"},
            id="plain-http-default-scheduler-no-policies",
        ),
        pytest.param(
            {
                "global.imageRegistry": "mirror.example.com",
                "imagePullSecrets[0].name": "pull",
                "podAnnotations.team": "gpu",
                "podLabels.team": "gpu",
                "extraEnv[0].name": "A",
                "extraEnv[0].value": "1",
                "scheduler.podLabels.only": "scheduler",
                "devicePlugin.extraEnv[0].name": "B",
                "devicePlugin.extraEnv[0].value": "2",
                "dashboards.enabled": "true",
                "criticalPodsQuota.enabled": "true",
            },
            id="pod-conventions-dashboards-quota",
        ),
        pytest.param(
            {
                "devicePlugin.pools[0].name": "inference",
                "devicePlugin.pools[0].gpuSplit": "4",
                "devicePlugin.pools[1].name": "training",
                "devicePlugin.pools[1].gpuSplit": "1",
                "metrics.service.enabled": "true",
            },
            id="two-node-pools",
        ),
    ],
)
def test_chart_applies_with_server_side_dry_run(
    cluster: Cluster, helm: Path, settings: dict[str, str]
) -> None:
    # as `helm install` renders for this cluster
    objs = objects(helm, *discovered_apis(cluster), **settings)
    out = apply(cluster, objs, dry_run=True)
    assert out.count("(server dry run)") == len(objs), out


# ---- what the chart configures is what the parts take ----------------------------------------


def cli_parser() -> argparse.ArgumentParser:
    """The extender's and the device plugin's subcommands, as `nodelock` registers them."""
    parser = argparse.ArgumentParser(prog="nodelock")
    sub = parser.add_subparsers(dest="command", required=True)
    extender_cli.register(sub)
    deviceplugin_cli.register(sub)
    return parser


def test_container_arguments_are_flags_the_nodelock_cli_accepts(helm: Path) -> None:
    objs = objects(helm)
    parser = cli_parser()
    ext_args = container(find(objs, "Deployment", "nodelock-extender"), "extender")["args"]
    ext = parser.parse_args(ext_args)
    # every address of both families (kube.opsport.listening_site): IPv4, IPv6 and dual-stack
    assert (ext.command, ext.lock_namespace, ext.listen) == ("extender", NS, "[::]:8443")
    assert ext.metrics_address == "::"
    assert (ext.tls_cert, ext.tls_key, ext.client_ca) == (
        "/etc/nodelock/tls/tls.crt",
        "/etc/nodelock/tls/tls.key",
        "/etc/nodelock/tls/ca.crt",
    )
    dp_args = container(find(objs, "DaemonSet", "nodelock-device-plugin"), "device-plugin")["args"]
    dp = parser.parse_args(dp_args)
    assert (dp.command, dp.lock_namespace, dp.backend) == ("device-plugin", NS, "nvml")
    assert str(dp.plugin_dir) == "/var/lib/kubelet/device-plugins"
    assert dp.metrics_address == "::"


def test_scheduler_configuration_has_the_extenders_own_entry(helm: Path) -> None:
    host = f"nodelock-extender.{NS}.svc"
    tls_dir = "/etc/nodelock/scheduler-tls"
    cases: list[tuple[dict[str, str], JSON]] = [
        (
            {},
            extender_entry(
                f"https://{host}:443",
                tls=ExtenderTLS(
                    ca_file=f"{tls_dir}/ca.crt",
                    cert_file=f"{tls_dir}/tls.crt",
                    key_file=f"{tls_dir}/tls.key",
                    server_name=host,
                ),
            ),
        ),
        (
            {"tls.requireClientCert": "false"},
            extender_entry(
                f"https://{host}:443",
                tls=ExtenderTLS(ca_file=f"{tls_dir}/ca.crt", server_name=host),
            ),
        ),
        ({"tls.enabled": "false"}, extender_entry(f"http://{host}:80")),
    ]
    for settings, expected in cases:
        cm = find(objects(helm, **settings), "ConfigMap", "nodelock-scheduler-config")
        config = yaml.safe_load(cm["data"]["config.yaml"])
        assert config["extenders"] == [expected], settings
        assert config["profiles"] == [{"schedulerName": "nodelock-scheduler"}]


def test_scheduler_configuration_matches_the_control_plane_file(helm: Path) -> None:
    """deploy/scheduler/ (a control plane's own kube-scheduler) and the chart's ConfigMap differ
    only in where the certificate files lie."""
    own = yaml.safe_load(
        (REPO_ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml").read_text()
    )
    cm = find(objects(helm), "ConfigMap", "nodelock-scheduler-config")
    [chart] = yaml.safe_load(cm["data"]["config.yaml"])["extenders"]
    [control_plane] = own["extenders"]
    for entry in (chart, control_plane):
        for key in ("caFile", "certFile", "keyFile"):
            entry["tlsConfig"].pop(key)
    assert chart == control_plane


def test_real_kube_scheduler_accepts_the_configuration_and_certificates(
    cluster: Cluster, helm: Path, tmp_path: Path
) -> None:
    objs = objects(helm)
    for key, value in find(objs, "Secret", "nodelock-scheduler-tls")["data"].items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    raw = find(objs, "ConfigMap", "nodelock-scheduler-config")["data"]["config.yaml"]
    # the same configuration, with this test's files instead of the pod's mounts and credentials
    local = yaml.safe_load(raw.replace("/etc/nodelock/scheduler-tls", str(tmp_path)))
    local["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig)}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(local))
    written = tmp_path / "effective.yaml"

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(cluster.binaries.kube_scheduler),
                f"--config={config}",
                f"--write-config-to={written}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    res = check()
    assert res.returncode == 0, res.stderr[-2000:]
    effective = yaml.safe_load(written.read_text())
    [profile] = effective["profiles"]
    assert profile["schedulerName"] == "nodelock-scheduler"
    assert effective["extenders"][0]["bindVerb"] == "bind"
    # and it refuses a broken one: the check above could fail
    local["extenders"][0]["tlsConfig"]["caFile"] = str(tmp_path / "missing.crt")
    config.write_text(yaml.safe_dump(local))
    assert check().returncode != 0


def _verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    key: Any = ca.public_key()
    assert cert.issuer == ca.subject
    if isinstance(key, rsa.RSAPublicKey):
        assert cert.signature_hash_algorithm is not None
        key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PKCS1v15(),
            cert.signature_hash_algorithm,
        )
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        assert cert.signature_hash_algorithm is not None
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )


def test_generated_certificates_chain_to_one_ca_with_the_service_names(helm: Path) -> None:
    objs = objects(helm)
    ext = find(objs, "Secret", "nodelock-extender-tls")["data"]
    sched = find(objs, "Secret", "nodelock-scheduler-tls")["data"]

    def load(b64: str) -> x509.Certificate:
        return x509.load_pem_x509_certificate(base64.b64decode(b64))

    ca, server, client = load(ext["ca.crt"]), load(ext["tls.crt"]), load(sched["tls.crt"])
    assert load(sched["ca.crt"]) == ca
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for cert in (server, client):
        _verify_signed_by(cert, ca)
        assert cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=365)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    assert {f"nodelock-extender.{NS}.svc", f"nodelock-extender.{NS}.svc.cluster.local"} <= dns
    assert not names.get_values_for_type(x509.IPAddress) or all(
        isinstance(i, ipaddress.IPv4Address | ipaddress.IPv6Address)
        for i in names.get_values_for_type(x509.IPAddress)
    )
    usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    # a second rendering (a fresh install) makes a different CA: nothing is baked into the chart
    again = find(objects(helm), "Secret", "nodelock-extender-tls")["data"]
    assert again["ca.crt"] != ext["ca.crt"]


def test_no_generated_key_in_the_plain_manifests() -> None:
    for path in MANIFESTS_DIR.glob("*.yaml"):
        assert "PRIVATE KEY" not in path.read_text(), path
        kinds = {o["kind"] for o in parse_documents(path.read_text())}
        assert "Secret" not in kinds, path


# ---- least privilege, as rendered (the live authorizer is checked in test_deploy_rbac) --------


def rules(objs: list[JSON], kind: str, name: str) -> set[tuple[str, str, str]]:
    out = set()
    for rule in find(objs, kind, name)["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def test_roles_grant_exactly_what_the_parts_use(helm: Path) -> None:
    objs = objects(helm)
    read = ("get", "list", "watch")
    events = {("", "events", "create"), ("", "events", "patch")}  # docs/events.md
    assert rules(objs, "ClusterRole", "nodelock-extender") == {
        *(("", r, v) for r in ("pods", "nodes") for v in read),
        ("", "pods/binding", "create"),
        ("", "pods", "patch"),  # extender.askAgainTurnedAway: nodelock-extender-pod-updates
        *events,
    }
    assert rules(objs, "Role", "nodelock-extender-locks") == {
        ("coordination.k8s.io", "leases", v) for v in (*read, "create", "update")
    }
    assert rules(objs, "ClusterRole", "nodelock-device-plugin") == {
        *(("", "pods", v) for v in read),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        *events,
        # the DRA check (deviceplugin/dra.py): is this node's resource also published by DRA?
        *(("resource.k8s.io", r, v) for r in ("deviceclasses", "resourceslices") for v in read[:2]),
    }
    assert rules(objs, "Role", "nodelock-device-plugin-locks") == {
        ("coordination.k8s.io", "leases", v) for v in (*read, "update")
    }
    for kind in ("Role", "RoleBinding"):
        for o in objs:
            if o["kind"] == kind and o["metadata"]["name"].endswith("-locks"):
                assert o["metadata"]["namespace"] == NS


def test_admission_policies_guard_the_handoffs_annotation_keys(helm: Path) -> None:
    for prefix in ("nodelock.io/", "gpu.example.com/"):
        objs = objects(helm, annotationPrefix=prefix)
        keys = Keys(prefix)
        policy = find(objs, "ValidatingAdmissionPolicy", "nodelock-assignment")
        variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
        assert yaml.safe_load(variables["keys"]) == [keys.assignment, keys.token, keys.bound_at]
        scope = find(objs, "ValidatingAdmissionPolicy", "nodelock-device-plugin-node-scope")
        assert f'"{keys.gpus}"' in scope["spec"]["validations"][1]["expression"]


def test_namespace_selector_label_values_render_as_strings(helm: Path) -> None:
    """A label value that reads as a number (``--set ...matchLabels.team=2024``) stays a string:
    rendered as a number, the API server refuses the policy bindings."""
    selectors = {
        f"admission.{key}.matchLabels.{label}": value
        for key in ("podNamespaceSelector", "gpuPods.namespaceSelector")
        for label, value in (("team", "2024"), ("tier", "gold"))
    }
    objs = objects(helm, **selectors)
    bindings = [
        o
        for o in objs
        if o["kind"].endswith("AdmissionPolicyBinding")
        and "namespaceSelector" in o["spec"].get("matchResources", {})
        and not o["spec"]["matchResources"]["namespaceSelector"].get("matchExpressions")
        and "kubernetes.io/metadata.name"
        not in o["spec"]["matchResources"]["namespaceSelector"].get("matchLabels", {})
    ]
    assert len(bindings) == 3  # the assignment policy's and the GPU pod policies' two
    for binding in bindings:
        labels = binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
        assert labels == {"team": "2024", "tier": "gold"}, binding["metadata"]["name"]


def test_label_values_that_came_back_as_json_numbers_render_as_integers(helm: Path) -> None:
    """``helm upgrade --reuse-values`` reads the release's values back from JSON, where every
    number is a float: a label value given as ``73584679`` must render as that, not as
    ``7.3584679e+07`` (which the API server refuses).  ``--set-json`` takes the same path."""
    objs = objects(
        helm,
        "--set-json",
        'admission.podNamespaceSelector.matchLabels={"team": 73584679, "tier": 2.5}',
        "--set-json",
        'devicePlugin.nodeSelector={"rack": 12}',
        "--set-json",
        'extraEnv=[{"name": "BATCH", "value": 1000000}, {"name": "RATIO", "value": 0.25}]',
    )
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "nodelock-assignment")
    labels = binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
    assert labels == {"team": "73584679", "tier": "2.5"}
    ds = find(objs, "DaemonSet", "nodelock-device-plugin")
    selector = ds["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {"nodelock.io/enabled": "true", "rack": "12"}  # merged with the default
    env = {e["name"]: e.get("value") for e in container(ds, "device-plugin")["env"]}
    assert (env["BATCH"], env["RATIO"]) == ("1000000", "0.25")


# ---- the device plugin's DaemonSet ------------------------------------------------------------


def test_device_plugin_runs_on_labelled_gpu_nodes_as_node_critical(helm: Path) -> None:
    ds = find(objects(helm), "DaemonSet", "nodelock-device-plugin")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nodelock.io/enabled": "true"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == {
        "device-plugins": "/var/lib/kubelet/device-plugins",
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "state": "/var/lib/nodelock",
        "driver-root": "/",
    }
    [init] = spec["initContainers"]
    assert "libnvidia-ml.so.1" in init["command"][-1]
    env = {e["name"]: e for e in container(ds, "device-plugin")["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["LD_LIBRARY_PATH"]["value"] == "/nvml"


def test_every_device_plugin_daemonset_runs_one_plugin_per_node_during_an_update(
    helm: Path,
) -> None:
    """A surge pod would run beside the old one on its node, both serving kubelet's socket and
    writing one checkpoint: every DaemonSet (pools too) replaces a node's pod only after the old
    one is gone (maxSurge 0), one node at a time."""
    objs = objects(
        helm, **{"devicePlugin.pools[0].name": "a", "devicePlugin.pools[0].gpuSplit": "2"}
    )
    daemonsets = [o for o in objs if o["kind"] == "DaemonSet"]
    assert len(daemonsets) == 2
    for ds in daemonsets:
        assert ds["spec"]["updateStrategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        }, ds["metadata"]["name"]


def test_mig_profiles_sent_to_the_extender_are_a_value(helm: Path) -> None:
    """kube-scheduler's managedResources are exact names: the MIG profiles come from
    ``migProfiles`` (default: the extender's own list, checked against ``extender_entry`` above)."""

    def managed(*args: str) -> list[str]:
        cm = find(objects(helm, *args), "ConfigMap", "nodelock-scheduler-config")
        [entry] = yaml.safe_load(cm["data"]["config.yaml"])["extenders"]
        return [r["name"] for r in entry["managedResources"] if "mig-" in r["name"]]

    assert managed() == [f"nvidia.com/mig-{p}" for p in MIG_PROFILES]
    assert managed("--set-json", 'migProfiles=["1g.10gb", "1g.23gb"]') == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.23gb",
    ]


def gpu_pod_bindings(objs: list[JSON]) -> list[JSON]:
    return [
        o
        for o in objs
        if o["kind"].endswith("AdmissionPolicyBinding")
        and o["spec"]["policyName"].endswith(("-gpu-pods", "-gpu-pods-scheduler"))
    ]


def test_gpu_pod_policies_judge_only_opted_in_namespaces_by_default(helm: Path) -> None:
    """A fresh install leaves other schedulers' GPU pods alone: both GPU pod policies (the
    validating one, and the mutating one where served) select only namespaces labelled
    <annotationPrefix>enabled=true, until the operator gives a selector of their own."""
    bindings = gpu_pod_bindings(objects(helm))
    assert len(bindings) == 2
    for binding in bindings:
        assert binding["spec"]["matchResources"]["namespaceSelector"] == {
            "matchLabels": {"nodelock.io/enabled": "true"}
        }, binding["metadata"]["name"]
    prefixed = gpu_pod_bindings(objects(helm, annotationPrefix="gpu.example.com/"))
    assert {json.dumps(b["spec"]["matchResources"]["namespaceSelector"]) for b in prefixed} == {
        '{"matchLabels": {"gpu.example.com/enabled": "true"}}'
    }
    every = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "Exists"}]}
    widened = objects(
        helm, "--set-json", f"admission.gpuPods.namespaceSelector={json.dumps(every)}"
    )
    assert [
        b["spec"]["matchResources"]["namespaceSelector"] for b in gpu_pod_bindings(widened)
    ] == [
        every,
        every,
    ]
    # the assignment policy refuses only writes of nodelock's own annotations: every namespace
    assignment = find(objects(helm), "ValidatingAdmissionPolicyBinding", "nodelock-assignment")
    assert "matchResources" not in assignment["spec"]


def test_critical_priority_classes_can_be_given_a_quota_or_left_out(helm: Path) -> None:
    """Where the API server admits critical pods outside kube-system only against a quota scoped
    to their class (GKE), ``criticalPodsQuota`` renders it for the classes the chart's pods use;
    each priority class can also be left out."""
    assert not [o for o in objects(helm) if o["kind"] == "ResourceQuota"]
    quota = find(
        objects(helm, **{"criticalPodsQuota.enabled": "true"}),
        "ResourceQuota",
        "nodelock-critical-pods",
    )
    assert quota["spec"] == {
        "hard": {"pods": "10000"},
        "scopeSelector": {
            "matchExpressions": [
                {
                    "scopeName": "PriorityClass",
                    "operator": "In",
                    "values": ["system-cluster-critical", "system-node-critical"],
                }
            ]
        },
    }
    none = {f"{part}.priorityClassName": "" for part in ("extender", "devicePlugin", "scheduler")}
    objs = objects(helm, **none, **{"criticalPodsQuota.enabled": "true"})
    assert not [o for o in objs if o["kind"] == "ResourceQuota"]
    for kind, name in (
        ("Deployment", "nodelock-extender"),
        ("Deployment", "nodelock-scheduler"),
        ("DaemonSet", "nodelock-device-plugin"),
    ):
        assert "priorityClassName" not in find(objs, kind, name)["spec"]["template"]["spec"]


def test_create_namespace_is_refused_against_a_cluster_only(helm: Path) -> None:
    """``createNamespace`` renders the Namespace offline (``helm template``, the manifests); the
    refusal against a live cluster is tested with ``helm install`` in test_deploy_helm_install."""
    objs = objects(helm, createNamespace="true")
    [ns] = [o for o in objs if o["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_simulated_backend_mounts_no_driver(helm: Path) -> None:
    ds = find(
        objects(helm, **{"devicePlugin.backend": "simulated"}),
        "DaemonSet",
        "nodelock-device-plugin",
    )
    spec = ds["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    assert all(v["name"] != "driver-root" for v in spec["volumes"])


# ---- node pools: a split count per pool, one DaemonSet each -------------------------------------

POOL_LABEL = "nodelock.io/gpu-pool"
TWO_POOLS = {
    "devicePlugin.pools[0].name": "inference",
    "devicePlugin.pools[0].gpuSplit": "4",
    "devicePlugin.pools[1].name": "training",
    "devicePlugin.pools[1].gpuSplit": "2",
}


def plugin_daemonsets(objs: list[JSON]) -> dict[str, JSON]:
    return {
        o["metadata"]["name"]: o
        for o in objs
        if o["kind"] == "DaemonSet" and "device-plugin" in o["metadata"]["name"]
    }


def gpu_split_args(ds: JSON) -> list[str]:
    return [a for a in container(ds, "device-plugin")["args"] if a.startswith("--gpu-split")]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_two_node_pools_render_a_daemonset_each_and_the_default_keeps_off_them(
    helm: Path,
) -> None:
    objs = objects(helm, *MONITORING_CRDS, "--set", "metrics.service.enabled=true", **TWO_POOLS)
    sets = plugin_daemonsets(objs)
    assert set(sets) == {
        "nodelock-device-plugin",
        "nodelock-device-plugin-inference",
        "nodelock-device-plugin-training",
    }
    default = sets["nodelock-device-plugin"]
    # a node in no pool keeps whole GPUs: the default DaemonSet runs without --gpu-split there
    assert gpu_split_args(default) == []
    spec = default["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nodelock.io/enabled": "true"}
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {
        "matchExpressions": [
            {"key": POOL_LABEL, "operator": "NotIn", "values": ["inference", "training"]}
        ]
    }
    for pool, split in (("inference", 4), ("training", 2)):
        ds = sets[f"nodelock-device-plugin-{pool}"]
        assert gpu_split_args(ds) == [f"--gpu-split={split}"]
        pod = ds["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"nodelock.io/enabled": "true", POOL_LABEL: pool}
        assert "affinity" not in pod
        # the pool's plugin is the default one in everything but its split
        want = [a for a in container(default, "device-plugin")["args"] if "--gpu-split" not in a]
        got = [a for a in container(ds, "device-plugin")["args"] if "--gpu-split" not in a]
        assert got == want
        assert pod["serviceAccountName"] == spec["serviceAccountName"]
    # the DaemonSets' selectors are disjoint (none adopts another's pods); the metrics Service
    # and so the ServiceMonitor reach every plugin pod
    service = find(objs, "Service", "nodelock-device-plugin-metrics")["spec"]["selector"]
    for name, ds in sets.items():
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert matches(ds["spec"]["selector"]["matchLabels"], labels), name
        assert matches(service, labels), name
        for other, ods in sets.items():
            if other != name:
                assert not matches(
                    ds["spec"]["selector"]["matchLabels"],
                    ods["spec"]["template"]["metadata"]["labels"],
                ), (name, other)
    # without pools: one DaemonSet, no affinity of its own, the split for every node
    [only] = plugin_daemonsets(objects(helm, **{"devicePlugin.gpuSplit": "4"})).values()
    assert gpu_split_args(only) == ["--gpu-split=4"]
    assert "affinity" not in only["spec"]["template"]["spec"]


def test_pools_keep_the_operators_own_node_affinity(helm: Path) -> None:
    """Each required term of devicePlugin.affinity keeps its expressions and gains the NotIn."""
    key = "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    objs = objects(
        helm,
        **TWO_POOLS,
        **{
            f"{key}.nodeSelectorTerms[0].matchExpressions[0].key": "zone",
            f"{key}.nodeSelectorTerms[0].matchExpressions[0].operator": "In",
            f"{key}.nodeSelectorTerms[0].matchExpressions[0].values[0]": "a",
            f"{key}.nodeSelectorTerms[1].matchExpressions[0].key": "gpu",
            f"{key}.nodeSelectorTerms[1].matchExpressions[0].operator": "Exists",
        },
    )
    sets = plugin_daemonsets(objs)
    affinity = sets["nodelock-device-plugin"]["spec"]["template"]["spec"]["affinity"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    not_pooled = {"key": POOL_LABEL, "operator": "NotIn", "values": ["inference", "training"]}
    assert terms == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, not_pooled]},
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}, not_pooled]},
    ]
    pool_affinity = sets["nodelock-device-plugin-inference"]["spec"]["template"]["spec"]
    assert pool_affinity["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"] == [t | {"matchExpressions": t["matchExpressions"][:1]} for t in terms]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (
            {
                "devicePlugin.pools[0].name": "a",
                "devicePlugin.pools[0].gpuSplit": "4",
                "devicePlugin.pools[1].name": "a",
                "devicePlugin.pools[1].gpuSplit": "2",
            },
            'the pool name "a" is given twice',
        ),
        ({"devicePlugin.pools[0].name": "a"}, "missing property 'gpuSplit'"),
        (
            {"devicePlugin.pools[0].name": "Big_Pool", "devicePlugin.pools[0].gpuSplit": "2"},
            "does not match pattern",
        ),
        (
            {"devicePlugin.pools[0].name": "a", "devicePlugin.pools[0].gpuSplit": "65"},
            "maximum",
        ),
        (
            {
                "devicePlugin.pools[0].name": "a",
                "devicePlugin.pools[0].gpuSplit": "2",
                "devicePlugin.pools[0].nodeSelector.x": "y",
            },
            "additional properties 'nodeSelector' not allowed",
        ),
    ],
)
def test_bad_pools_fail_with_a_clear_error(helm: Path, settings: dict[str, str], says: str) -> None:
    with pytest.raises(DevclusterError) as err:
        objects(helm, **settings)
    assert says in str(err.value), err.value


def test_the_daemonset_controller_runs_each_nodes_pool_plugin_and_no_other(
    cluster: Cluster, helm: Path
) -> None:
    """The real DaemonSet controller on three Nodes (no kubelet): one per pool and one in no
    pool; each gets exactly one plugin pod, from its pool's DaemonSet, and the node in no pool
    the default one's (whole GPUs)."""
    tag = secrets.token_hex(4)
    namespace = f"pools-{tag}"
    selector = f"devicePlugin.nodeSelector.{TEST_LABEL}"
    rendered = parse_documents(
        render(
            helm,
            release="nodelock",
            namespace=namespace,
            settings={**TWO_POOLS, selector: tag, "devicePlugin.backend": "simulated"},
        )
    )
    objs = [o for o in rendered if o["kind"] in ("ServiceAccount", "DaemonSet")]
    pools = {f"pool-a-{tag}": "inference", f"pool-b-{tag}": "training", f"no-pool-{tag}": None}
    nodes: list[JSON] = []
    for node, pool in pools.items():
        labels = {TEST_LABEL: tag, "nodelock.io/enabled": "true"}
        labels |= {POOL_LABEL: pool} if pool else {}
        # unschedulable: no other pod lands here; a DaemonSet's pods tolerate it
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": labels},
                "spec": {"unschedulable": True},
            }
        )
    namespace_obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    apply(cluster, [namespace_obj, *nodes])
    try:
        apply(cluster, objs)
        want = {
            f"pool-a-{tag}": ("nodelock-device-plugin-inference", ["--gpu-split=4"]),
            f"pool-b-{tag}": ("nodelock-device-plugin-training", ["--gpu-split=2"]),
            f"no-pool-{tag}": ("nodelock-device-plugin", []),
        }
        got: dict[str, list[tuple[str, list[str]]]] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json"))
            got = {}
            for pod in pods["items"]:
                [owner] = pod["metadata"]["ownerReferences"]
                terms = pod["spec"]["affinity"]["nodeAffinity"][
                    "requiredDuringSchedulingIgnoredDuringExecution"
                ]["nodeSelectorTerms"]
                node = next(
                    f["values"][0]
                    for t in terms
                    for f in t.get("matchFields", [])
                    if f["key"] == "metadata.name"
                )
                split = gpu_split_args({"spec": {"template": {"spec": pod["spec"]}}})
                got.setdefault(node, []).append((owner["name"], split))
            if len(pods["items"]) >= len(want):
                break
            time.sleep(0.5)
        time.sleep(2)  # and no second pod comes for any node
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json"))
        assert len(pods["items"]) == len(want), got
        assert got == {node: [w] for node, w in want.items()}
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *pools, "--wait=false", check=False)


def test_optional_monitoring_objects_render(helm: Path) -> None:
    assert not [o for o in objects(helm) if o["apiVersion"].startswith("monitoring.coreos.com")]
    settings = {"metrics.serviceMonitor.enabled": "true", "prometheusRule.enabled": "true"}
    # the Prometheus Operator's CRDs are checked: without them, a clear error, not a failed apply
    for key in settings:
        with pytest.raises(DevclusterError, match="install the Prometheus Operator's CRDs"):
            objects(helm, **{key: "true"})
    objs = objects(helm, *MONITORING_CRDS, **settings)
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"nodelock-extender", "nodelock-device-plugin"}
    # Prometheus scrapes the plain-HTTP metrics port: it holds no certificate that opens /bind
    for monitor in monitors.values():
        [endpoint] = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "metrics"
        assert endpoint.get("scheme", "http") == "http"
        assert "tlsConfig" not in endpoint
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    extender = find(objs, "Deployment", "nodelock-extender")
    [ext] = extender["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in ext["ports"]}
    assert ports["metrics"] != ports["https"]
    assert f"--metrics-port={ports['metrics']}" in ext["args"]
    [svc_port] = services["nodelock-extender-metrics"]["spec"]["ports"]
    assert svc_port["targetPort"] == "metrics"
    for probe in ("livenessProbe", "readinessProbe"):
        assert ext[probe]["httpGet"]["port"] == "metrics", probe
        assert ext[probe]["httpGet"].get("scheme", "HTTP") == "HTTP", probe
    rule = find(objs, "PrometheusRule", "nodelock")
    chart_rules = yaml.safe_load((CHART_DIR / "files" / "alerts.yaml").read_text())
    assert rule["spec"]["groups"] == chart_rules["groups"]
    for r in (r for g in rule["spec"]["groups"] for r in g["rules"]):
        assert r["annotations"]["runbook_url"].endswith(f"docs/metrics.md#{r['alert'].lower()}")
    own = objects(
        helm,
        *MONITORING_CRDS,
        **{
            "prometheusRule.enabled": "true",
            "prometheusRule.groups[0].name": "mine",
            "prometheusRule.groups[0].rules[0].alert": "X",
            "prometheusRule.groups[0].rules[0].expr": "vector(1)",
        },
    )
    groups = find(own, "PrometheusRule", "nodelock")["spec"]["groups"]
    assert groups == [{"name": "mine", "rules": [{"alert": "X", "expr": "vector(1)"}]}]


def test_nvml_init_container_copies_the_drivers_library_alone(helm: Path, tmp_path: Path) -> None:
    ds = find(objects(helm), "DaemonSet", "nodelock-device-plugin")
    [init] = ds["spec"]["template"]["spec"]["initContainers"]
    root, out = tmp_path / "driver-root", tmp_path / "nvml"
    out.mkdir()
    # an ELF header for this machine (the class and machine fields of /bin/sh's), and a 32-bit x86
    # one (class 1, machine 3), as a driver install's lib/i386-linux-gnu holds
    native = Path("/bin/sh").resolve().read_bytes()[:20]
    i386 = b"\x7fELF\x01\x01\x01" + bytes(9) + b"\x03\x00" + b"\x03\x00"
    script = init["command"][-1].replace("/driver-root", str(root)).replace("/nvml/", f"{out}/")

    def run() -> subprocess.CompletedProcess[str]:
        cmd = [*init["command"][:-1], script]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)

    # no driver: the init container fails and says where it looked
    missing = run()
    assert missing.returncode != 0
    assert "libnvidia-ml.so.1 for this machine not found" in missing.stderr
    # the 32-bit library alone, where the search looks first (usr/lib before lib): not taken
    lib32 = root / "usr" / "lib" / "i386-linux-gnu"
    lib32.mkdir(parents=True)
    (lib32 / "libnvidia-ml.so.570.86.15").write_bytes(i386 + b" nvml 32")
    (lib32 / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.86.15")
    only32 = run()
    assert only32.returncode != 0
    assert f"not for this machine: {lib32}/libnvidia-ml.so.1" in only32.stderr
    # a host install: the versioned file behind the soname link, next to the host's libc
    libdir = root / "lib" / "x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "libnvidia-ml.so.570.86.15").write_bytes(native + b" nvml")
    (libdir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.86.15")
    (libdir / "libc.so.6").write_bytes(native + b" libc")
    found = run()
    assert found.returncode == 0, found.stderr
    copied = out / "libnvidia-ml.so.1"
    assert not copied.is_symlink()
    assert copied.read_bytes() == native + b" nvml"
    assert sorted(p.name for p in out.iterdir()) == ["libnvidia-ml.so.1"]


# ---- chart conventions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("extender.replica", "3", "additional properties 'replica' not allowed"),  # replicas
        ("devicePlugin.metricPort", "9000", "additional properties 'metricPort' not allowed"),
        ("extender.policy", "binpak", "value must be one of"),
        ("tls.source", "certmanager", "value must be one of"),
        ("leaseDurationSeconds", "1", "minimum"),
        ("extender.bindWaitBudgetSeconds", "soon", "does not match pattern"),
    ],
)
def test_a_misspelt_value_fails_lint_and_template(
    helm: Path, key: str, value: str, says: str
) -> None:
    for command in (["lint", "--strict"], ["template", "x"]):
        res = subprocess.run(
            [str(helm), *command, str(CHART_DIR), "--set", f"{key}={value}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode != 0, f"helm {command[0]} accepted {key}={value}"
        assert says in res.stdout + res.stderr, res.stdout + res.stderr


def test_values_the_schema_must_not_refuse(helm: Path) -> None:
    """Values of the right meaning in the shapes `--set` produces (a decimal is a string there,
    an XID list a number) and the globals of an umbrella chart."""
    objs = objects(
        helm,
        **{
            "extender.bindWaitBudgetSeconds": "2.5",
            "devicePlugin.nvml.ignoredXids": "79",
            "global.somethingElse": "x",
            "extender.podDisruptionBudget.minAvailable": "50%",
        },
    )
    ext = container(find(objs, "Deployment", "nodelock-extender"), "extender")
    assert "--bind-wait-budget=2.5" in ext["args"]


WORKLOADS = [
    ("Deployment", "nodelock-extender", "extender", "extender"),
    ("DaemonSet", "nodelock-device-plugin", "device-plugin", "devicePlugin"),
    ("Deployment", "nodelock-scheduler", "kube-scheduler", "scheduler"),
]


def test_pod_metadata_env_pull_secrets_and_registry_on_every_workload(helm: Path) -> None:
    settings = {
        "global.imageRegistry": "mirror.example.com:5000/",
        "imagePullSecrets[0].name": "pull",
        "podAnnotations.team": "gpu",
        "podLabels.cost-center": "ml",
        "extraEnv[0].name": "HTTPS_PROXY",
        "extraEnv[0].value": "http://proxy:3128",
    }
    for _, _, _, key in WORKLOADS:
        settings[f"{key}.podAnnotations.only"] = key
        settings[f"{key}.podLabels.only"] = key
        settings[f"{key}.podLabels.cost-center"] = f"{key}-wins"
        settings[f"{key}.extraEnv[0].name"] = "ONLY"
        settings[f"{key}.extraEnv[0].value"] = key
    objs = objects(helm, **settings)
    for kind, name, cname, key in WORKLOADS:
        template = find(objs, kind, name)["spec"]["template"]
        meta, spec = template["metadata"], template["spec"]
        assert meta["annotations"]["team"] == "gpu", name
        assert meta["annotations"]["only"] == key, name
        assert meta["labels"]["only"] == key, name
        assert meta["labels"]["cost-center"] == f"{key}-wins", name
        assert meta["labels"]["app.kubernetes.io/instance"] == "nodelock", name  # selector kept
        assert spec["imagePullSecrets"] == [{"name": "pull"}], name
        c = container(find(objs, kind, name), cname)
        env = [(e["name"], e.get("value")) for e in c["env"]]
        assert env[-2:] == [("HTTPS_PROXY", "http://proxy:3128"), ("ONLY", key)], name
        for image in [c["image"], *(i["image"] for i in spec.get("initContainers", []))]:
            assert image.startswith("mirror.example.com:5000/"), image
            assert "ghcr.io" not in image, image
            assert "registry.k8s.io" not in image, image
    scheduler = container(find(objs, "Deployment", "nodelock-scheduler"), "kube-scheduler")
    assert scheduler["image"].startswith("mirror.example.com:5000/kube-scheduler:v")
    # the annotations that restart pods on a change stay
    extender_meta = find(objs, "Deployment", "nodelock-extender")["spec"]["template"]["metadata"]
    assert "checksum/tls" in extender_meta["annotations"]
    # the rendering with all of these is what the API server accepts
    # (server-side dry run: test_chart_applies_with_server_side_dry_run, "pod-conventions")


def test_scheduler_image_follows_the_clusters_version_unless_set(helm: Path) -> None:
    def image(*args: str, **settings: str) -> str:
        objs = objects(helm, *args, **settings)
        tag: str = container(find(objs, "Deployment", "nodelock-scheduler"), "kube-scheduler")[
            "image"
        ]
        return tag

    assert image("--kube-version=v1.33.4") == "registry.k8s.io/kube-scheduler:v1.33.4"
    # a distribution's suffix is not a kube-scheduler tag
    assert image("--kube-version=v1.34.1-eks-3a5b1") == "registry.k8s.io/kube-scheduler:v1.34.1"
    assert image("--kube-version=v1.35.2+k3s1") == "registry.k8s.io/kube-scheduler:v1.35.2"
    pinned = image("--kube-version=v1.34.4", **{"scheduler.image.tag": "v1.33.9"})
    assert pinned == "registry.k8s.io/kube-scheduler:v1.33.9"


def test_dashboards_ship_as_configmaps_grafana_picks_up(helm: Path) -> None:
    assert not [o for o in objects(helm) if "-dashboard-" in o["metadata"]["name"]]
    objs = objects(helm, **{"dashboards.enabled": "true", "dashboards.namespace": "monitoring"})
    maps = {o["metadata"]["name"]: o for o in objs if "-dashboard-" in o["metadata"]["name"]}
    sources = sorted((REPO_ROOT / "dashboards").glob("*.json"))
    assert sorted(maps) == [f"nodelock-dashboard-{p.stem}" for p in sources]
    for path in sources:
        cm = maps[f"nodelock-dashboard-{path.stem}"]
        assert cm["kind"] == "ConfigMap"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "monitoring"
        [(key, text)] = cm["data"].items()
        assert key.endswith(".json")
        assert json.loads(text) == json.loads(path.read_text())


def test_cert_manager_issues_the_certificates_and_every_render_is_the_same(helm: Path) -> None:
    settings = {"tls.source": "cert-manager"}
    with pytest.raises(DevclusterError, match="install cert-manager first"):
        objects(helm, **settings)
    first = render(helm, settings=settings, extra_args=CERT_MANAGER_CRDS)
    assert render(helm, settings=settings, extra_args=CERT_MANAGER_CRDS) == first  # GitOps
    objs = parse_documents(first)
    assert not [o for o in objs if o["kind"] == "Secret"]  # no key material in the rendering
    certs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Certificate"}
    ext, sched = certs["nodelock-extender-tls"]["spec"], certs["nodelock-scheduler-tls"]["spec"]
    assert ext["secretName"] == "nodelock-extender-tls"
    assert f"nodelock-extender.{NS}.svc" in ext["dnsNames"]
    assert "server auth" in ext["usages"]
    assert sched["secretName"] == "nodelock-scheduler-tls"
    assert "client auth" in sched["usages"]
    # both signed by the chart's own CA issuer, backed by a self-signed CA certificate
    assert (
        ext["issuerRef"]
        == sched["issuerRef"]
        == {
            "name": "nodelock-ca",
            "kind": "Issuer",
            "group": "cert-manager.io",
        }
    )
    assert certs["nodelock-ca"]["spec"]["isCA"] is True
    issuers = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "Issuer"}
    assert issuers == {
        "nodelock-selfsigned": {"selfSigned": {}},
        "nodelock-ca": {"ca": {"secretName": "nodelock-ca"}},
    }
    # the pods mount the Secrets cert-manager writes
    extender = find(objs, "Deployment", "nodelock-extender")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "nodelock-extender-tls"}} in extender["volumes"]
    # an issuer of the organisation's own instead
    own = parse_documents(
        render(
            helm,
            settings={
                **settings,
                "tls.certManager.issuerRef.name": "corp-ca",
                "tls.certManager.issuerRef.kind": "ClusterIssuer",
                "tls.certManager.issuerRef.group": "cert-manager.io",
            },
            extra_args=CERT_MANAGER_CRDS,
        )
    )
    assert not [o for o in own if o["kind"] == "Issuer"]
    refs = [o["spec"]["issuerRef"]["name"] for o in own if o["kind"] == "Certificate"]
    assert refs == ["corp-ca", "corp-ca"]
