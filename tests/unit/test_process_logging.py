"""Log level and format: validated with one-line errors; JSON lines parse as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kube.process import LogConfigError, parse_log_format, parse_log_level

SCRIPT = """
import logging
from kube.process import configure_logging
configure_logging("debug", log_format="json")
configure_logging("info")  # a part configuring its level keeps the chosen format
log = logging.getLogger("nodelock.test")
log.debug("not shown at info")
log.info("two\\nlines and \\"quotes\\" %s", "é")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("failed")
"""


def test_json_log_lines_are_json_objects() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "info"
    assert first["logger"] == "nodelock.test"
    assert first["message"] == 'two\nlines and "quotes" é'
    assert first["time"].endswith("Z")
    assert "T" in first["time"]
    assert second["message"] == "failed"
    assert "ZeroDivisionError" in second["exception"]


@pytest.mark.parametrize("text", ["info", "INFO", "Warning", " debug "])
def test_levels_in_any_case(text: str) -> None:
    assert parse_log_level(text) > 0


@pytest.mark.parametrize("text", ["loud", "", "warn ing", "5"])
def test_a_bad_level_is_one_line(text: str) -> None:
    with pytest.raises(LogConfigError, match="use one of debug, info, warning, error, critical"):
        parse_log_level(text)


def test_formats() -> None:
    assert parse_log_format("JSON").value == "json"
    with pytest.raises(LogConfigError, match="use one of text, json"):
        parse_log_format("xml")
