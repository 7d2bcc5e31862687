"""Calls to Airflow's REST API through airflow_api.py, one server process per test and Airflow home.

Building the API server's app is most of what a call costs (about 11 CPU-seconds), so a test's calls go to
one `airflow_api.py serve` process, started by its first call with that Airflow's Python and environment
and ended after the test (tests/integration/conftest.py calls `close_all`).
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
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
        # Its answers, read by a thread: a line Airflow prints to stdout may come with an answer in one read,
        # which a select() on the pipe would then wait for in vain.
        self.answers: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self.read_answers, daemon=True).start()

    def read_answers(self) -> None:
        assert self.process.stdout
        for line in self.process.stdout:
            if line.startswith("ANSWER "):
                self.answers.put(json.loads(line.removeprefix("ANSWER ")))
        self.answers.put(None)  # the process ended

    def call(self, command: str, dag_id: str, task_id: str, timeout: float) -> tuple[int, str]:
        """The call's exit code and what it printed (the response's status and body)."""
        assert self.process.stdin
        self.process.stdin.write(f"{command} {dag_id} {task_id}\n")
        self.process.stdin.flush()
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            answer = None
        if answer is None:
            raise AssertionError(f"airflow_api.py {command} {dag_id} {task_id}: no answer within {timeout}s "
                                 f"(exit code {self.process.poll()})\n{self.log.read_text(errors='replace')[-3000:]}")
        return answer["code"], answer["output"]

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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
