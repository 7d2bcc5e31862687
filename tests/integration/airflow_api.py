"""Act on a task instance through Airflow's public REST API, as a user in the UI does.

`python airflow_api.py mark-failed DAG_ID TASK_ID` PATCHes the task instance of the DAG's only run
to `failed` through the API server's own app (in process, against the metadata DB of
AIRFLOW_HOME); `clear DAG_ID TASK_ID` clears it (the UI's "Clear": its next try runs); `state DAG_ID
TASK_ID` prints its state. Run it with the Python of the Airflow
under test, so each Airflow version is driven through its own API.

`python airflow_api.py serve` builds the app once (about 11 CPU-seconds: most of a call's cost) and then
answers each line of its input (`COMMAND DAG_ID TASK_ID`) with one line, `ANSWER` and a JSON object of
the call's exit code and output, until its input ends: airflow_api_client.api_call keeps one per test.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from fastapi.testclient import TestClient


def client() -> TestClient:
    """The API server's app, called as a signed-in admin of the simple auth manager."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    app = create_app()
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="ADMIN"))
    return TestClient(app, base_url="http://localhost", headers={"Authorization": f"Bearer {token}"})


def task_instance_url(api: TestClient, dag_id: str, task_id: str) -> str:
    response = api.get(f"/api/v2/dags/{dag_id}/dagRuns")
    response.raise_for_status()
    (run,) = response.json()["dag_runs"]
    return f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances/{task_id}"


def call(api: TestClient, command: str, dag_id: str, task_id: str) -> int:
    url = task_instance_url(api, dag_id, task_id)
    if command == "mark-failed":
        response = api.patch(url, json={"new_state": "failed"})
    elif command == "clear":
        run_id = url.split("/dagRuns/", 1)[1].split("/", 1)[0]
        response = api.post(f"/api/v2/dags/{dag_id}/clearTaskInstances",
                            json={"dry_run": False, "task_ids": [task_id], "dag_run_id": run_id,
                                  "only_failed": False, "reset_dag_runs": True})
    elif command == "state":
        response = api.get(url)
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(response.status_code, response.text, flush=True)
    if response.is_success and command == "state":
        print(f"TASK-STATE {response.json()['state']}", flush=True)
    return 0 if response.is_success else 1


def serve() -> int:
    api = client()
    for line in sys.stdin:
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            try:
                code = call(api, *line.split())
            except (Exception, SystemExit) as error:  # said to the caller, as a one-shot call's traceback
                print(f"{type(error).__name__}: {error}")
                code = 1
        print("ANSWER", json.dumps({"code": code, "output": output.getvalue()}), flush=True)
    return 0


def main(command: str, *args: str) -> int:
    if command == "serve":
        return serve()
    return call(client(), command, *args)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
