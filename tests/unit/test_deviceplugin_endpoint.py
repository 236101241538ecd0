"""The plugin's Register retry schedule and request, from plain data."""

from __future__ import annotations

import pytest

from deviceplugin.endpoint import (
    API_VERSION,
    REGISTER_RETRY_S,
    register_request,
    register_retry_s,
)


def test_retries_start_at_50_ms_and_double_up_to_a_second() -> None:
    delays = [register_retry_s(n) for n in range(1, 9)]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_a_long_run_of_refusals_stays_at_the_cap() -> None:
    assert register_retry_s(10_000) == REGISTER_RETRY_S


def test_the_request_names_the_socket_the_resource_and_preferred_allocation() -> None:
    request = register_request("nodelock-gpu.sock", "nvidia.com/gpu")
    assert request.version == API_VERSION == "v1beta1"
    assert request.endpoint == "nodelock-gpu.sock"
    assert request.resource_name == "nvidia.com/gpu"
    assert request.options.get_preferred_allocation_available
