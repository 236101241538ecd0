"""The handoff benchmark's reading of kube-apiserver's /metrics: requests, handler time and
watch events by kind, net of the idle background, per pod."""

from bench.apiserver import Snapshot, lines, parse, per_pod


def sample(name: str, value: float, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value:g}\n"


LEASES = {"group": "coordination.k8s.io", "resource": "leases", "version": "v1"}
PODS = {"group": "", "resource": "pods", "version": "v1"}
REQ = "apiserver_request_total"
DUR = "apiserver_request_duration_seconds_sum"
LONG = "apiserver_longrunning_requests"
SCRAPE = (
    "# HELP apiserver_request_total Counter of apiserver requests\n"
    + sample(REQ, 4, code="201", **LEASES, subresource="", verb="POST")
    + sample(REQ, 10, code="200", **LEASES, subresource="", verb="PUT")
    + sample(REQ, 2, code="409", **LEASES, subresource="", verb="PUT")
    + sample(REQ, 6, code="201", **PODS, subresource="binding", verb="POST")
    + sample(REQ, 3, code="200", **PODS, subresource="", verb="WATCH")
    + sample(DUR, 0.5, **LEASES, scope="resource", subresource="", verb="PUT")
    + sample(DUR, 900, **PODS, scope="cluster", subresource="", verb="WATCH")
    + sample(DUR, 0.25, **PODS, scope="resource", subresource="binding", verb="POST")
    + sample("apiserver_watch_events_total", 30, **LEASES)
    + sample("apiserver_watch_events_sizes_sum", 12000, **LEASES)
    + sample("apiserver_watch_events_total", 60, **PODS)
    + sample(LONG, 5, **PODS, scope="cluster", subresource="", verb="WATCH")
    + sample(LONG, 2, **PODS, scope="namespace", subresource="", verb="WATCH")
    + sample(LONG, 1, **PODS, scope="cluster", subresource="log", verb="CONNECT")
    + "process_cpu_seconds_total 12.5\n"
)


def test_parse_keys_requests_by_verb_and_resource_and_leaves_long_running_time_out() -> None:
    snap = parse(SCRAPE)
    assert snap.requests[("PUT", "leases")] == 12  # every code
    assert snap.requests[("POST", "pods/binding")] == 6
    assert snap.handler_s == {("PUT", "leases"): 0.5, ("POST", "pods/binding"): 0.25}
    assert snap.watch_events == {"leases": 30, "pods": 60}
    assert snap.watch_bytes == {"leases": 12000.0}
    assert snap.watchers == {"pods": 7}  # WATCH only, every scope
    assert snap.cpu_s == 12.5


def test_the_older_kind_label_names_the_watched_resource() -> None:
    snap = parse('apiserver_watch_events_total{group="",kind="Pod",version="v1"} 9\n')
    assert snap.watch_events == {"Pod": 9}


def test_difference_net_of_background_and_per_pod_figures() -> None:
    before = parse(SCRAPE)
    after = parse(
        SCRAPE.replace(sample(REQ, 10, code="200", **LEASES, subresource="", verb="PUT"), "")
        .replace(sample(DUR, 0.5, **LEASES, scope="resource", subresource="", verb="PUT"), "")
        .replace(sample("apiserver_watch_events_total", 30, **LEASES), "")
        + sample(REQ, 26, code="200", **LEASES, subresource="", verb="PUT")  # 16 more PUTs
        + sample(DUR, 1.3, **LEASES, scope="resource", subresource="", verb="PUT")
        + sample("apiserver_watch_events_total", 70, **LEASES)
    )
    idle = Snapshot()
    idle.requests[("PUT", "leases")] = 4  # 4 renewals per background period
    idle.watch_events["leases"] = 8
    net = (after - before).net_of(idle, 2.0)
    assert net.requests == {("PUT", "leases"): 8}  # 16 less 2 x 4
    assert net.watch_events == {"leases": 24}  # 40 less 2 x 8
    cost = per_pod(net, 8)
    assert cost["handler_ms_per_pod"] == {"PUT leases": 100.0}  # 0.8 s over 8 pods
    assert cost["watch_events_per_pod"] == {"leases": 3.0}
    assert cost["fanout"] == {"leases": 3.0}  # 24 events for 8 writes
    assert cost["watchers"] == {"pods": 7}
    text = "\n".join(lines("nodelock", cost))
    assert "PUT leases 100.00" in text
    assert "leases 3.0 (0.0 kB, 0 watches, 3.0 per write)" in text


def test_nothing_counted_below_zero_when_the_background_outruns_the_burst() -> None:
    burst = Snapshot()
    burst.requests[("PUT", "leases")] = 1
    idle = Snapshot()
    idle.requests[("PUT", "leases")] = 5
    assert burst.net_of(idle, 1.0).requests == {}
