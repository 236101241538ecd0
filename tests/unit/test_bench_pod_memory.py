"""The pod memory bench's pure parts: memory.stat, a cgroup's files, the container id, the chart's
resources and the ratios printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.pod_memory import (
    MIB,
    ChartMemory,
    Memory,
    chart_memory,
    container_id,
    find_cgroup,
    memory_from_files,
    parse_memory_stat,
    plugin_figures,
    problems,
    read_memory,
)
from devcluster.errors import DevclusterError

pytestmark = pytest.mark.unit

VALUES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "nodelock" / "values.yaml"

V1_STAT = """cache 4325376
rss 108003328
rss_huge 0
mapped_file 2162688
hierarchical_memory_limit 402653184
total_rss 108003328
"""


def test_memory_stat_lines_become_a_mapping_and_other_lines_are_skipped() -> None:
    stat = parse_memory_stat(V1_STAT + "garbage\nnot a number\n")
    assert stat["rss"] == 108003328
    assert stat["hierarchical_memory_limit"] == 402653184
    assert "garbage" not in stat
    assert "not" not in stat


def test_cgroup_v1_files_give_rss_usage_peak_and_limit() -> None:
    m = memory_from_files(
        1,
        {
            "memory.stat": V1_STAT,
            "memory.usage_in_bytes": "120000000\n",
            "memory.max_usage_in_bytes": "230000000\n",
            "memory.limit_in_bytes": "402653184\n",
        },
    )
    assert m == Memory(1, rss=108003328, usage=120000000, peak=230000000, limit=402653184)


def test_cgroup_v1_without_a_limit_says_none() -> None:
    m = memory_from_files(
        1,
        {
            "memory.stat": V1_STAT,
            "memory.usage_in_bytes": "1\n",
            "memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    assert m.limit is None
    assert m.peak is None


def test_cgroup_v2_reads_anon_current_peak_and_max() -> None:
    m = memory_from_files(
        2,
        {
            "memory.stat": "anon 5000\nfile 7000\n",
            "memory.current": "12000\n",
            "memory.peak": "20000\n",
            "memory.max": "max\n",
        },
    )
    assert m == Memory(2, rss=5000, usage=12000, peak=20000, limit=None)


def test_a_cgroup_missing_its_figures_is_an_error() -> None:
    with pytest.raises(ValueError, match="anon"):
        memory_from_files(2, {"memory.stat": V1_STAT, "memory.current": "1"})
    with pytest.raises(ValueError, match="usage_in_bytes"):
        memory_from_files(1, {"memory.stat": V1_STAT})
    with pytest.raises(ValueError, match="version 3"):
        memory_from_files(3, {})


def test_container_id_is_the_part_after_the_runtime() -> None:
    assert container_id("containerd://0123abcd") == "0123abcd"
    with pytest.raises(ValueError, match="0123abcd"):
        container_id("0123abcd")
    with pytest.raises(ValueError, match="containerd://"):
        container_id("containerd://")


def test_find_cgroup_prefers_k8s_io_then_a_name_holding_the_id(tmp_path: Path) -> None:
    (tmp_path / "k8s.io" / "aaa").mkdir(parents=True)
    scope = tmp_path / "kubepods.slice" / "pod1.slice" / "cri-containerd-bbb.scope"
    scope.mkdir(parents=True)
    assert find_cgroup(tmp_path, "aaa") == tmp_path / "k8s.io" / "aaa"
    assert find_cgroup(tmp_path, "bbb") == scope
    with pytest.raises(DevclusterError, match="ccc"):
        find_cgroup(tmp_path, "ccc")


def test_read_memory_reads_the_files_there_are(tmp_path: Path) -> None:
    (tmp_path / "memory.stat").write_text(V1_STAT)
    (tmp_path / "memory.usage_in_bytes").write_text("120000000\n")
    (tmp_path / "memory.max_usage_in_bytes").write_text("130000000\n")
    m = read_memory(tmp_path, 1)
    assert (m.rss, m.usage, m.peak, m.limit) == (108003328, 120000000, 130000000, None)


def test_the_chart_values_give_each_component_its_memory() -> None:
    text = VALUES.read_text(encoding="utf-8")
    plugin = chart_memory(text, "devicePlugin")
    assert plugin.request_mib is not None
    assert plugin.limit_mib is not None
    assert plugin.request_mib < plugin.limit_mib
    values = "devicePlugin:\n  resources:\n    requests: {memory: 1Gi}\n"
    assert chart_memory(values, "devicePlugin") == ChartMemory(1024.0, None)
    assert chart_memory(values, "extender") == ChartMemory(None, None)


def test_plugin_figures_are_ratios_to_the_chart_and_to_rest() -> None:
    rest = Memory(1, rss=64 * MIB, usage=96 * MIB, peak=150 * MIB, limit=384 * MIB)
    serving = Memory(1, rss=80 * MIB, usage=100 * MIB, peak=150 * MIB, limit=384 * MIB)
    f = plugin_figures(
        rest, serving, [192 * MIB, 200 * MIB], [160 * MIB, 128 * MIB], ChartMemory(128.0, 400.0)
    )
    assert f["rest_rss_mib"] == 64
    assert f["rest_rss_vs_request"] == 0.5
    assert f["rest_usage_vs_request"] == 0.75
    assert f["audit_peak_mib"] == 200
    assert f["audit_peaks_mib"] == [192, 200]
    assert f["audit_peak_vs_limit"] == 0.5
    assert f["audit_peak_vs_rest_usage"] == pytest.approx(200 / 96)
    assert f["audit_rss_mib"] == 160
    assert f["audit_rss_vs_limit"] == 0.4
    assert f["audit_rss_vs_rest_rss"] == 2.5
    assert f["cgroup_limit_mib"] == 384
    none = plugin_figures(rest, serving, [], [], ChartMemory(None, None))
    assert none["audit_peak_mib"] is None
    assert none["rest_rss_vs_request"] is None


def test_problems_name_a_failed_audit_and_a_restart() -> None:
    result = {
        "audits": [[{"node": "gpu-node-01", "exit": 0}], [{"node": "gpu-node-01", "exit": 137}]],
        "at_rest": [
            {"pod": "plugin", "container": "device-plugin", "restarts": 0},
            {"pod": "extender", "container": "extender", "restarts": 1},
        ],
        "restarts_after": {"plugin/device-plugin": 1, "extender/extender": 1},
    }
    assert problems(result) == [
        "audit 2 on gpu-node-01: exit 137",
        "plugin/device-plugin restarted (0 -> 1)",
    ]
    result["audits"] = [[{"node": "gpu-node-01", "exit": 0}]]
    result["restarts_after"] = {"plugin/device-plugin": 0, "extender/extender": 1}
    assert problems(result) == []
