"""The provider's OpenLineage facets. Imported only when the OpenLineage provider's listener asks an
operator for its lineage (the `openlineage` client comes with apache-airflow-providers-openlineage)."""

from __future__ import annotations

from typing import Any

import attr
from openlineage.client.facet_v2 import JobFacet, RunFacet

SCHEMA = "https://github.com/airflow-volcano/airflow-volcano/blob/main/docs/openlineage-facets.json#/$defs/"


@attr.define
class VolcanoJobFacet(JobFacet):
    """The Volcano Job a task runs: where, in which queue, launched how, each task's replicas, image and
    resources. Nothing of the pods' environment, command or arguments (a secret may be there)."""

    namespace: str | None = attr.field(default=None)
    name: str | None = attr.field(default=None)
    queue: str | None = attr.field(default=None)
    priorityClass: str | None = attr.field(default=None)  # noqa: N815 - OpenLineage's camelCase
    operator: str | None = attr.field(default=None)
    launcher: str | None = attr.field(default=None)
    tasks: dict[str, Any] = attr.field(factory=dict)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA + "VolcanoJobFacet"


@attr.define
class VolcanoRunFacet(RunFacet):
    """What became of the Volcano Job in this run: its uid, phase and restarts, and why it failed."""

    uid: str | None = attr.field(default=None)
    namespace: str | None = attr.field(default=None)
    name: str | None = attr.field(default=None)
    phase: str | None = attr.field(default=None)
    restarts: int | None = attr.field(default=None)
    failure: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA + "VolcanoRunFacet"
