"""Durations and timestamps between Python and protobuf."""

from __future__ import annotations

import datetime as dt
import math

from google.protobuf import duration_pb2, timestamp_pb2

Seconds = dt.timedelta | float | int
"""A duration: a timedelta, or seconds as a number."""


def seconds(value: Seconds, field: str) -> float:
    if isinstance(value, dt.timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        s = float(value)
    else:
        raise TypeError(f"{field}: expected a timedelta or seconds, got {type(value).__name__}")
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"{field}: must be a finite, non-negative duration, got {value!r}")
    return s


def duration(value: Seconds, field: str) -> duration_pb2.Duration:
    s = seconds(value, field)
    whole = math.floor(s)
    return duration_pb2.Duration(seconds=whole, nanos=round((s - whole) * 1e9) % 1_000_000_000)


def timestamp(value: dt.datetime, field: str) -> timestamp_pb2.Timestamp:
    if not isinstance(value, dt.datetime):
        raise TypeError(f"{field}: expected a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise ValueError(f"{field}: the datetime needs a time zone (a naive one is ambiguous)")
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value.astimezone(dt.timezone.utc))
    return ts


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def from_timestamp(ts: timestamp_pb2.Timestamp, present: bool) -> dt.datetime | None:
    """A timezone-aware UTC datetime (to the microsecond), or None for an unset field."""
    if not present:
        return None
    # A tenth of Timestamp.ToDatetime's cost, which matters once per delivery.
    return _EPOCH + dt.timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)
