"""An auth manager for the panel's tests: Airflow's simple auth manager, where the user `outsider` may
read no DAG. The panel asks whichever auth manager the deployment configured; this one lets a test
see it refuse a signed-in user who may not read a DAG's task instances (the simple auth manager alone
lets every role read every DAG)."""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

OUTSIDER = "outsider"


class OneOutsiderAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, user: Any, **kwargs: Any) -> bool:
        if user.get_name() == OUTSIDER:
            return False
        return super().is_authorized_dag(user=user, **kwargs)
