"""MicroTime strings: always six fraction digits and ``Z`` (docs/design.md, "Lease and time
rules")."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockd.microtime import (
    format_microtime,
    microtime_from_epoch,
    now_microtime,
    parse_microtime,
)

SHAPE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def test_microsecond_zero_keeps_six_digits() -> None:
    moment = datetime(2024, 5, 1, 12, 0, 0, 0, tzinfo=UTC)
    assert moment.isoformat() == "2024-05-01T12:00:00+00:00"  # what we must not send
    assert format_microtime(moment) == "2024-05-01T12:00:00.000000Z"


def test_epoch_on_a_whole_second() -> None:
    assert microtime_from_epoch(1_714_564_800.0) == "2024-05-01T12:00:00.000000Z"


def test_epoch_fraction_rounds_up_into_the_next_second() -> None:
    assert microtime_from_epoch(1_714_564_800.9999997) == "2024-05-01T12:00:01.000000Z"


def test_offset_is_converted_to_utc() -> None:
    moment = datetime(2024, 5, 1, 14, 30, 0, 42, tzinfo=timezone(timedelta(hours=2)))
    assert format_microtime(moment) == "2024-05-01T12:30:00.000042Z"


def test_naive_datetime_is_taken_as_utc() -> None:
    assert format_microtime(datetime(2024, 1, 2, 3, 4, 5, 6)) == "2024-01-02T03:04:05.000006Z"


def test_now_uses_the_injected_wall_clock() -> None:
    assert now_microtime(lambda: 0.0) == "1970-01-01T00:00:00.000000Z"


@given(st.datetimes(timezones=st.just(UTC)))
def test_format_then_parse_round_trips(moment: datetime) -> None:
    text = format_microtime(moment)
    assert SHAPE.match(text)
    assert parse_microtime(text) == moment


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T12:00:00Z", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01T12:00:00.5Z", datetime(2024, 5, 1, 12, 0, 0, 500_000, tzinfo=UTC)),
        ("2024-05-01T12:00:00.123456789Z", datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)),
        ("2024-05-01T14:00:00.000001+02:00", datetime(2024, 5, 1, 12, 0, 0, 1, tzinfo=UTC)),
    ],
)
def test_parse_accepts_server_forms(text: str, expected: datetime) -> None:
    assert parse_microtime(text) == expected


@pytest.mark.parametrize("text", ["", "2024-05-01", "2024-05-01 12:00:00Z", "yesterday"])
def test_parse_rejects_other_strings(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_microtime(text)
