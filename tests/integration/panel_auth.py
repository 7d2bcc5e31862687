"""An auth manager for the panel's tests: Airflow's simple auth manager, with users it limits as a real
deployment's would (the simple auth manager alone lets every role read every DAG and its logs):

- `outsider` may read no DAG;
- `nologs` may read every DAG's task instances, but no task log;
- `team` (role user: may edit XComs) may read and edit only its own DAGs (TEAM_DAGS), no other team's.

The panel asks whichever auth manager the deployment configured; this one lets a test see it refuse."""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

OUTSIDER = "outsider"
NO_LOGS = "nologs"
TEAM = "team"
TEAM_DAGS = frozenset({"panel_mine", "panel_mine_waits"})
USERS = f"admin:admin,{OUTSIDER}:viewer,{NO_LOGS}:viewer,{TEAM}:user"


class OneOutsiderAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, user: Any, **kwargs: Any) -> bool:
        name = user.get_name()
        if name == OUTSIDER:
            return False
        if name == NO_LOGS and kwargs.get("access_entity") == DagAccessEntity.TASK_LOGS:
            return False
        details = kwargs.get("details")
        if name == TEAM and (details is None or details.id not in TEAM_DAGS):
            return False
        return super().is_authorized_dag(user=user, **kwargs)
