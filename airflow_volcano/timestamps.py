"""The one reader of Kubernetes' timestamps (RFC 3339 in UTC: `2026-11-24T17:21:06Z`, and a pod log's
`2026-11-24T17:21:06.123456789Z`; `2026-11-24T17:21:06+00:00` where the client's models turned them into
datetimes and back), and how a time is shown. Standard library only."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any


def parse_timestamp_ns(stamp: str) -> int | None:
    """RFC 3339 (nano) timestamp in UTC -> integer nanoseconds since the epoch; None if not one."""
    if stamp.endswith("+00:00"):
        stamp = stamp[:-6] + "Z"
    if not stamp.endswith("Z") or "T" not in stamp:
        return None
    whole, _, fraction = stamp[:-1].partition(".")
    seconds = _epoch_seconds(whole)
    if seconds is None or (fraction and not fraction.isdigit()):
        return None
    return seconds * 1_000_000_000 + int((fraction or "0").ljust(9, "0")[:9])


@functools.lru_cache(maxsize=64)
def _epoch_seconds(whole: str) -> int | None:
    """Seconds since the epoch of "YYYY-MM-DDTHH:MM:SS" (cached: a busy log repeats each second
    across many lines, and strptime is most of the cost of copying a line)."""
    try:
        return int(datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())
    except ValueError:
        return None


def parse_time(value: Any) -> float | None:
    """A Kubernetes timestamp as epoch seconds; None if it is not one."""
    if not isinstance(value, str):
        return None
    nanoseconds = parse_timestamp_ns(value)
    return None if nanoseconds is None else nanoseconds / 1e9


def clock_text(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%S UTC")
