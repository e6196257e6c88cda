"""Durations and times as the asyncd API writes them."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Union

Duration = Union[timedelta, int, float, str]
"""A timedelta, a number of seconds, or a humantime string such as "90s" or "1h 30m"."""

_UNITS = (
    (86_400_000_000, "d"),
    (3_600_000_000, "h"),
    (60_000_000, "m"),
    (1_000_000, "s"),
    (1_000, "ms"),
    (1, "us"),
)


def format_duration(d: Duration) -> str:
    """Renders ``d`` in humantime form ("1h 30m 500ms"), which the API parses.
    Strings are passed through for the server to judge."""
    if isinstance(d, str):
        return d
    if isinstance(d, bool):
        raise TypeError("a duration cannot be a bool")
    if isinstance(d, (int, float)):
        d = timedelta(seconds=d)
    if not isinstance(d, timedelta):
        raise TypeError(f"a duration must be a timedelta, seconds or a string, not {type(d).__name__}")
    us = (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds
    if us < 0:
        raise ValueError(f"negative duration {d}")
    if us == 0:
        return "0s"
    parts = []
    for size, name in _UNITS:
        n, us = divmod(us, size)
        if n:
            parts.append(f"{n}{name}")
    return " ".join(parts)


def format_time(t: datetime, name: str = "eta") -> str:
    """RFC 3339 in UTC with milliseconds. Naive datetimes are refused: whether they
    meant local time or UTC cannot be told, and a wrong guess shifts the ETA. ``name``
    is the field the error names."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc))")
    u = t.astimezone(timezone.utc)
    return u.strftime("%Y-%m-%dT%H:%M:%S.") + f"{u.microsecond // 1000:03d}Z"


_FRACTION = re.compile(r"\.(\d+)")


def parse_time(s: str) -> datetime:
    """Parses the API's RFC 3339 times into aware datetimes (Python < 3.11's
    fromisoformat takes neither "Z" nor every fraction length)."""
    s = s.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    s = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], s, count=1)
    t = datetime.fromisoformat(s)
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t


def duration_seconds(d: Duration) -> float:
    """Seconds in a timedelta or number (strings are not parsed here)."""
    if isinstance(d, timedelta):
        return d.total_seconds()
    if isinstance(d, (int, float)) and not isinstance(d, bool):
        return float(d)
    raise TypeError(f"expected a timedelta or seconds, not {type(d).__name__}")


_SPAN = re.compile(r"\s*(\d+)\s*([a-zA-Zµ]+)")
_UNIT_SECONDS = {
    "ns": 1e-9, "nsec": 1e-9, "us": 1e-6, "µs": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "millis": 1e-3,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800,
}


def parse_duration(s: str) -> timedelta:
    """Parses the common humantime forms ("90s", "1h 30m", "500ms", "3d")."""
    pos, total, text = 0, 0.0, s.strip()
    if not text:
        raise ValueError("empty duration")
    while pos < len(text):
        m = _SPAN.match(text, pos)
        if not m or m.group(2) not in _UNIT_SECONDS:
            raise ValueError(f"bad duration {s!r}")
        total += int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    return timedelta(seconds=total)
