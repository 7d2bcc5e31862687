"""Unit-test-wide state."""

from __future__ import annotations

import pytest

from airflow_volcano.hooks.retry import ConnectionLossAware


@pytest.fixture(autouse=True)
def apiserver_never_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hooks remember process-wide when the apiserver was last unreachable or unavailable (a 401/403 is
    retried for a while after): each test starts in a process where it never was, whatever ran before."""
    monkeypatch.setattr(ConnectionLossAware, "_connection_lost_at", float("-inf"))
