"""The chart's TLS, end to end: the real kube-scheduler calls the real extender over HTTPS with
the client certificate Helm generated, and the extender binds with its own service account.

Everything the chart would put in the pods comes from one rendering of it: the extender's
arguments and certificates (Secret), kube-scheduler's ``extenders:`` entry and client certificate
(ConfigMap, Secret), and the exec probe the Deployment runs.  Only the addresses change: the
extender listens on loopback and kube-scheduler dials 127.0.0.1 while verifying the certificate
against the Service's DNS name (``tlsConfig.serverName``, as in the chart).
"""

from __future__ import annotations

import base64
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from devcluster import processes
from devcluster.cluster import Cluster
from devcluster.gpunodes import nodelock_command
from devcluster.helm import ensure_helm
from devcluster.pki import ADMIN
from handoff.wire import ContainerName, Keys, parse_assignment
from kube.client import KubeClient, lease_path, node_path, pod_path
from tests.integration.deploy_kit import JSON, TestRelease, token, token_kubeconfig
from tests.integration.extender_kit import create_gpu_node, device_ids, pod_body, wait_for

KEYS = Keys()


@dataclass
class Served:
    release: TestRelease
    url: str
    tls_dir: Path  # the extender's Secret
    client_dir: Path  # kube-scheduler's Secret
    metrics_url: str  # the plain-HTTP metrics and probe port, as the chart configures it
    readiness: str  # the Deployment's readiness probe (an httpGet) as a URL on that port


def secret_files(release: TestRelease, name: str, directory: Path) -> Path:
    directory.mkdir()
    for key, value in release.one("Secret", name)["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
    return directory


def deployment_container(release: TestRelease) -> JSON:
    deploy = release.one("Deployment", release.extender_sa)
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    result: JSON = container
    return result


@pytest.fixture(scope="module")
def served(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # default values (Helm generates the certificates), but the devcluster's own kube-scheduler
    # plays the chart's second scheduler: GPU pods for "default-scheduler" are the ones that
    # reach the extender (the chart's GPU pod policies would steer them to nodelock-scheduler)
    rel = TestRelease.render(
        ensure_helm(),
        settings={"admission.gpuPods.schedulerNames": "{default-scheduler}"},
        cluster=cluster,
    )
    rel.install(cluster)
    tmp = tmp_path_factory.mktemp("deploy-tls")
    tls_dir = secret_files(rel, f"{rel.name}-extender-tls", tmp / "extender-tls")
    client_dir = secret_files(rel, f"{rel.name}-scheduler-tls", tmp / "scheduler-tls")
    port = processes.free_port()
    metrics_port = processes.free_port()
    container = deployment_container(rel)
    args = [
        a.replace("/etc/nodelock/tls", str(tls_dir))
        for a in container["args"]
        if not a.startswith(("--listen=", "--metrics-address=", "--metrics-port="))
    ]
    # the chart's addresses, every address of IPv4 and IPv6, are kept; the tests dial 127.0.0.1
    assert {"--listen=[::]:8443", "--metrics-address=::"} <= set(container["args"])
    kubeconfig = token_kubeconfig(
        cluster, tmp / "extender.kubeconfig", token(cluster, rel.namespace, rel.extender_sa)
    )
    component = f"deploy-extender-{rel.tag}"
    cluster.start_component(
        component,
        [
            *nodelock_command(),
            *args,
            f"--listen=[::]:{port}",
            "--metrics-address=::",
            f"--metrics-port={metrics_port}",
            f"--kubeconfig={kubeconfig}",
        ],
    )
    # the chart's probe is an httpGet on the container port named "metrics"
    probe = container["readinessProbe"]["httpGet"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["port"] == "metrics"
    assert "metrics" in named
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    readiness = f"{metrics_url}{probe['path']}"
    deadline = time.monotonic() + 60
    while http_get(readiness)[0] != 200:
        assert time.monotonic() < deadline, "the extender's readiness probe never passed"
        time.sleep(0.2)
    try:
        yield Served(rel, f"https://127.0.0.1:{port}", tls_dir, client_dir, metrics_url, readiness)
    finally:
        cluster.stop_component(component)
        rel.uninstall(cluster)


def scheduler_entry(served: Served) -> JSON:
    """The chart's ``extenders:`` entry, dialling the loopback address."""
    cm = served.release.one("ConfigMap", f"{served.release.scheduler_sa}-config")
    [entry] = yaml.safe_load(cm["data"]["config.yaml"])["extenders"]
    entry["urlPrefix"] = served.url
    tls = entry["tlsConfig"]
    for key in ("certFile", "keyFile", "caFile"):
        tls[key] = tls[key].replace("/etc/nodelock/scheduler-tls", str(served.client_dir))
    assert tls["serverName"] == f"{served.release.extender_sa}.{served.release.namespace}.svc"
    result: JSON = entry
    return result


def http_get(url: str, *, method: str = "GET") -> tuple[int, str]:
    """Plain HTTP (no certificate of any kind): the status and body, or (0, the error)."""
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, repr(exc)


def status_line(
    served: Served, *, cert: tuple[Path, Path] | None, method: str = "GET", path: str = "/readyz"
) -> str:
    """``method path`` (GET /readyz) over TLS to the extender's loopback address, verifying its
    certificate for the Service's name as kube-scheduler does (tlsConfig.serverName); the
    answer's status line, or the error that ended the exchange."""
    host = f"{served.release.extender_sa}.{served.release.namespace}.svc"
    ctx = ssl.create_default_context(cafile=str(served.client_dir / "ca.crt"))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    port = int(served.url.rsplit(":", 1)[1])
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.sendall(
                f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            answer = b""
            while chunk := tls.recv(4096):
                answer += chunk
    except (ssl.SSLError, OSError) as exc:
        return f"error: {exc!r}"
    return answer.decode("latin-1").split("\r\n", 1)[0] or "error: closed without an answer"


def test_extender_requires_a_client_certificate_from_the_charts_ca(
    served: Served, cluster: Cluster
) -> None:
    scheduler_cert = (served.client_dir / "tls.crt", served.client_dir / "tls.key")
    assert status_line(served, cert=scheduler_cert) == "HTTP/1.1 200 OK"
    assert status_line(served, cert=None).startswith("error:")
    # a certificate from another CA (the devcluster's admin) is refused as well
    other_ca = (cluster.pki.client_cert(ADMIN), cluster.pki.client_key(ADMIN))
    assert status_line(served, cert=other_ca).startswith("error:")
    # and the probe the chart runs fails when the extender does not answer
    port = served.metrics_url.rsplit(":", 1)[1]
    dead = served.readiness.replace(f":{port}/", f":{processes.free_port()}/")
    assert http_get(dead)[0] == 0


def test_metrics_port_needs_no_certificate_and_reaches_no_verb(served: Served) -> None:
    """Prometheus scrapes without any credential, and the scrape path cannot bind a pod: the
    metrics port serves no verb, and the mTLS port serves no /metrics."""
    status, text = http_get(f"{served.metrics_url}/metrics")
    assert status == 200
    assert "nodelock_extender_requests_total" in text
    assert "nodelock_build_info" in text
    assert http_get(f"{served.metrics_url}/healthz") == (200, "ok\n")
    assert http_get(f"{served.metrics_url}/readyz") == (200, "ok\n")
    for verb in ("bind", "filter", "prioritize"):
        assert http_get(f"{served.metrics_url}/{verb}", method="POST")[0] in (404, 405), verb
    assert http_get(f"{served.metrics_url}/metrics", method="POST")[0] == 405
    # the mTLS port, even with kube-scheduler's certificate, no longer serves /metrics
    scheduler_cert = (served.client_dir / "tls.crt", served.client_dir / "tls.key")
    assert status_line(served, cert=scheduler_cert, path="/metrics") == "HTTP/1.1 404 Not Found"
    # while the verbs are still served on the mTLS port (an empty bind is a 400, not a 404)
    assert status_line(served, cert=scheduler_cert, method="POST", path="/bind") == (
        "HTTP/1.1 400 Bad Request"
    )


async def test_real_kube_scheduler_binds_a_gpu_pod_through_the_extender_over_mtls(
    served: Served, cluster: Cluster, kube: KubeClient
) -> None:
    rel = served.release
    node = f"nl-{rel.tag}-gpu"
    cluster.restart_scheduler({"extenders": [scheduler_entry(served)]})
    try:
        await create_gpu_node(kube, node, test=rel.tag, gpus=2)
        body = pod_body("trainer", test=rel.tag, gpus=1, scheduler="default-scheduler")
        await kube.create(pod_path(rel.workload_namespace), body)

        async def bound() -> JSON | None:
            pod = await kube.get(pod_path(rel.workload_namespace, "trainer"))
            return pod if pod["spec"].get("nodeName") else None

        pod = await wait_for(bound, timeout_s=90)
        assert pod["spec"]["nodeName"] == node
        annotations = pod["metadata"]["annotations"]
        devices = parse_assignment(annotations[KEYS.assignment])[ContainerName("main")]
        assert len(devices) == 1
        assert devices[0] in device_ids(node, 2)
        # the lock the extender took with its own service account, in the chart's lock namespace
        lease = await kube.get(lease_path(rel.namespace, node))
        assert lease["spec"]["holderIdentity"] == f"{rel.workload_namespace}/trainer"
        assert int(annotations[KEYS.token]) == lease["spec"]["leaseTransitions"]
    finally:
        cluster.restart_scheduler({})
        await kube.delete(node_path(node))
