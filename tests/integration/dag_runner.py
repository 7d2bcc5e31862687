"""Run a DAG once through Airflow's own dag.test(), in this process or as a separate one.

As a script (`python dag_runner.py DAG_FILE DAG_ID [LOGICAL_DATE]`) it plays an Airflow worker
that can be SIGTERMed or kill -9ed by a test; the same logical date means the same run_id, so a
second run is the same task instance coming back (a retry after a crash).
"""

from __future__ import annotations

import datetime
import importlib.util
import sys
from typing import Any


def sync_to_db(dag: Any) -> None:
    """dag.test() needs the DAG serialized in the metadata DB, as the DAG processor would do."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    DagBundlesManager().sync_bundles_to_db()
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session=session
        )


def run_dag(dag: Any, logical_date: datetime.datetime | None = None) -> Any:
    sync_to_db(dag)
    if logical_date is None:
        return dag.test()
    # The run_id comes from run_after: the same date makes the same run, i.e. the same task
    # instance coming back, as after a worker crash and a retry.
    return dag.test(logical_date=logical_date, run_after=logical_date)


def main(dag_file: str, dag_id: str, logical_date: str | None = None) -> int:
    spec = importlib.util.spec_from_file_location("dag_under_test", dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    assert dag.dag_id == dag_id
    run = run_dag(dag, datetime.datetime.fromisoformat(logical_date) if logical_date else None)
    print(f"DAG-RUN-STATE {run.state}", flush=True)
    return 0 if str(run.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
