"""A run's figures to Airflow's metrics: whatever the deployment configured in `[metrics]` (StatsD,
Datadog's DogStatsD, OpenTelemetry), through Airflow's own `Stats` client, with the DAG and the task
as tags, so a platform team can chart queue wait and goodput per DAG.

Names (gauges, one value per finished run): `volcano.job.<bucket>_seconds` for each bucket of
`goodput.BUCKETS` and `volcano.job.wall_seconds`; `volcano.job.accelerator_hours`; `volcano.job.preemptions`
(how many times the run was preempted); `volcano.job.goodput` (the useful share of the held time, 0 to 1;
not sent for a run that never started).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_volcano.observability.goodput import BUCKETS, Goodput

PREFIX = "volcano.job."


def stats_client() -> Any:
    """Airflow's metrics client of this process (Airflow 3.2 and later in the Task SDK; 3.1 in core)."""
    try:
        from airflow.sdk.observability.stats import Stats
    except ImportError:
        from airflow.stats import Stats
    return Stats


def figures(goodput: Goodput) -> dict[str, float]:
    """The metrics of one run, by name."""
    values = {f"{PREFIX}{bucket}_seconds": goodput.seconds[bucket] for bucket in BUCKETS}
    values[f"{PREFIX}wall_seconds"] = goodput.wall
    values[f"{PREFIX}accelerator_hours"] = goodput.accelerator_hours
    values[f"{PREFIX}preemptions"] = float(goodput.preemptions)
    if goodput.useful_share is not None:
        values[f"{PREFIX}goodput"] = goodput.useful_share
    return values


def send(goodput: Goodput, tags: Mapping[str, str]) -> None:
    """Send a run's figures; a metrics backend that fails costs the task nothing."""
    stats = stats_client()
    for name, value in figures(goodput).items():
        stats.gauge(name, round(value, 3), tags=dict(tags))
