"""Calls to Airflow's REST API through airflow_api.py, one server process per test and Airflow home.

Building the API server's app is most of what a call costs (about 11 CPU-seconds), so a test's calls go to
one `airflow_api.py serve` process, started by its first call with that Airflow's Python and environment
and ended after the test (tests/integration/conftest.py calls `close_all`).
"""

from __future__ import annotations

import json
import selectors
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

AIRFLOW_API = Path(__file__).with_name("airflow_api.py")


class AirflowAPI:
    """One `airflow_api.py serve` process."""

    def __init__(self, python: str | Path, env: Mapping[str, str]) -> None:
        self.log = Path(env["AIRFLOW_HOME"]) / "airflow-api.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen([str(python), str(AIRFLOW_API), "serve"], env=dict(env),
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)

    def call(self, command: str, dag_id: str, task_id: str, timeout: float) -> tuple[int, str]:
        """The call's exit code and what it printed (the response's status and body)."""
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(f"{command} {dag_id} {task_id}\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(timeout=max(deadline - time.monotonic(), 0)):
                    break
                line = self.process.stdout.readline()
                if not line:
                    break
                if line.startswith("ANSWER "):
                    answer = json.loads(line.removeprefix("ANSWER "))
                    return answer["code"], answer["output"]
        raise AssertionError(f"airflow_api.py {command} {dag_id} {task_id}: no answer within {timeout}s "
                             f"(exit code {self.process.poll()})\n{self.log.read_text(errors='replace')[-3000:]}")

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()


_SERVERS: dict[tuple[str, tuple[tuple[str, str], ...]], AirflowAPI] = {}


def api_call(python: str | Path, env: Mapping[str, str], command: str, dag_id: str, task_id: str,
             timeout: float = 120) -> tuple[int, str]:
    """`command` (state, mark-failed, clear) on the task instance, as a user through the REST API: the
    exit code and output of `airflow_api.py command dag_id task_id`."""
    key = (str(python), tuple(sorted(env.items())))
    server = _SERVERS.get(key)
    if server is None or server.process.poll() is not None:
        server = _SERVERS[key] = AirflowAPI(python, env)
    return server.call(command, dag_id, task_id, timeout)


def close_all() -> None:
    while _SERVERS:
        _SERVERS.popitem()[1].close()
