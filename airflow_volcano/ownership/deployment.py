"""Which Airflow deployment a Job belongs to: staging and prod (or an old deployment and its replacement)
sharing a namespace run the same DAGs with the same run ids, and must never adopt, sweep or delete each
other's Jobs. Every Job the provider creates carries its deployment's id (label
`airflow-volcano.io/deployment`); reattaching, the orphan sweep and cleanup consider only Jobs of their own.

The id is, in order: the setting `[volcano] deployment_id` (for a deployment that moves its metadata
database, or that wants a readable name), else an Airflow Variable the provider creates in its own metadata
database at its first submission (`airflow_volcano_deployment_id`, a random id): distinct for two Airflows
by default, with no configuration, and stable across restarts and upgrades. Pure but for the Variable
calls it is given.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_volcano.constants import DEPLOYMENT_LABEL
from airflow_volcano.exceptions import JobSpecError

DEPLOYMENT_OPTION = "deployment_id"
DEPLOYMENT_VARIABLE = "airflow_volcano_deployment_id"
# A label value: at most 63 characters, alphanumeric at both ends, `-_.` between.
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def checked_id(value: str, where: str) -> str:
    """A deployment id as a label value, or a JobSpecError naming where it came from."""
    value = value.strip()
    if not LABEL_VALUE.match(value):
        raise JobSpecError(f"{where}: {value!r} is not a valid deployment id (at most 63 letters, digits, '-', '_' "
                           "or '.', starting and ending with a letter or digit)")
    return value


# After storing a new id, how long to wait before reading it back: two first submissions at once (an
# upsert each) then both read the one stored last.
SETTLE_SECONDS = 2.0


def deployment_id(configured: str | None, get_variable: Callable[[], str | None],
                  set_variable: Callable[[str], None], sleep: Callable[[float], None] = time.sleep) -> str:
    """This deployment's id: the setting if given; else the Variable, created with a random id when
    missing and read back a moment later (two first submissions at once: the one stored last wins for
    both). Paid once in a deployment's life."""
    if configured and configured.strip():
        return checked_id(configured, f"[volcano] {DEPLOYMENT_OPTION}")
    stored = get_variable()
    if not stored:
        set_variable(secrets.token_hex(6))
        sleep(SETTLE_SECONDS)
        stored = get_variable()
    if not stored:
        raise JobSpecError(f"this Airflow's deployment id could not be stored (Variable {DEPLOYMENT_VARIABLE}): set "
                           f"[volcano] {DEPLOYMENT_OPTION} (AIRFLOW__VOLCANO__DEPLOYMENT_ID) to a name of this "
                           "deployment")
    return checked_id(str(stored), f"Variable {DEPLOYMENT_VARIABLE}")


def deployment_of(job: Mapping[str, Any]) -> str | None:
    """The deployment a Job (or its PodGroup, which carries its labels) says it belongs to; None for a
    Job of a release before deployment ids."""
    return ((job.get("metadata") or {}).get("labels") or {}).get(DEPLOYMENT_LABEL)


def known_deployment_id(configured: str | None, stored: str | None) -> str | None:
    """This deployment's id where it may only be read (the API server's panel): the setting, else the
    stored Variable; None if neither (the deployment has submitted no Job)."""
    for value in (configured, stored):
        if value and value.strip():
            return value.strip()
    return None


def of_deployment(job: Mapping[str, Any], deployment: str | None) -> bool:
    """Whether a Job may be this deployment's: it names this deployment, or none (an earlier release's)."""
    labelled = deployment_of(job)
    return labelled is None or labelled == deployment


def this_deployment() -> str:
    """This Airflow deployment's id: `[volcano] deployment_id`, else the Variable the provider keeps in
    this deployment's metadata database (made on first use)."""
    from airflow.sdk import Variable

    from airflow_volcano.compat import conf

    return deployment_id(
        conf.get("volcano", DEPLOYMENT_OPTION, fallback=""),
        lambda: Variable.get(DEPLOYMENT_VARIABLE, default=None),
        lambda value: Variable.set(DEPLOYMENT_VARIABLE, value, description=(
            "airflow-volcano: this Airflow deployment's id, the label airflow-volcano.io/deployment of every "
            "Volcano Job it submits (two Airflows sharing a namespace never touch each other's Jobs). Keep it; "
            "a deployment that moves its database sets [volcano] deployment_id instead.")))
