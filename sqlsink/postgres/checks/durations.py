"""Durations: as PostgreSQL shows them, round recommendations, the time required."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlsink.postgres.checks.model import FLOOR_S


def format_seconds(seconds: float) -> str:
    """A duration the way PostgreSQL shows one: 500ms, 36s, 10min, 2h, 1d."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


_LADDER = (60, 300, 900, 1800, 3600, 7200, 21600, 43200, 86400)
_MAX_TIMEOUT_S = 2_147_483.647  # the timeouts are int milliseconds


def recommended(required_s: float) -> str:
    """A round value at least ``required_s``, as a SQL literal: '15min'."""
    for step in _LADDER:
        if step >= required_s:
            return f"'{format_seconds(step)}'"
    hours = math.ceil(required_s / 3600)
    if hours * 3600 > _MAX_TIMEOUT_S:
        return "0"  # longer than the setting can be: off
    return f"'{hours}h'"


@dataclass(frozen=True)
class Required:
    seconds: float
    text: str  # what was compared with, for the message


def required_time(
    trigger_interval_s: float | None, slowest_write_s: float | None, safety_factor: float
) -> Required:
    trigger = trigger_interval_s if trigger_interval_s and trigger_interval_s > 0 else None
    slowest = slowest_write_s if slowest_write_s and slowest_write_s > 0 else None
    if trigger is None and slowest is None:
        return Required(
            FLOOR_S,
            f"the conservative floor of {format_seconds(FLOOR_S)} (neither the trigger interval "
            "nor the slowest partition write is known)",
        )
    parts: list[tuple[float, str]] = []
    if trigger is not None:
        parts.append((trigger, f"the trigger interval ({format_seconds(trigger)})"))
    if slowest is not None:
        scaled = slowest * safety_factor
        parts.append(
            (
                scaled,
                f"{safety_factor:g} x the slowest partition write ({safety_factor:g} x "
                f"{format_seconds(slowest)} = {format_seconds(scaled)})",
            )
        )
    if len(parts) == 1:
        return Required(*parts[0])
    longest = max(p[0] for p in parts)
    return Required(
        longest, f"the longer of {parts[0][1]} and {parts[1][1]}, i.e. {format_seconds(longest)}"
    )
