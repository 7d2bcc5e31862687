"""Run a DAG once through Airflow's own dag.test(), in this process or as a separate one.

As a script (`python dag_runner.py DAG_FILE DAG_ID [LOGICAL_DATE] [--retry] [--external-triggerer]`)
it plays an Airflow worker that can be SIGTERMed or kill -9ed by a test. With --retry it runs the
next try of the DAG run's task instances, as the scheduler does after a worker died: the same task
instance (and its task state store), try_number + 1. Without it, dag.test() replaces any earlier
run of that logical date with a new one (same run_id, new task instance). With
--external-triggerer a deferred task stays deferred in the metadata DB for a real
`airflow triggerer` to run, and this loop resumes it when the triggerer fires.
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


def leave_triggers_to_a_triggerer() -> None:
    """dag.test() runs triggers in line; make it leave them to a real triggerer process instead."""
    from airflow.sdk.definitions import dag as dag_module

    run_task = dag_module._run_task
    dag_module._run_task = lambda **kwargs: run_task(**{**kwargs, "run_triggerer": False})


def run_dag(dag: Any, logical_date: datetime.datetime | None = None) -> Any:
    sync_to_db(dag)
    if logical_date is None:
        return dag.test()
    # The run_id comes from run_after: the same date makes the same run, i.e. the same task
    # instance coming back, as after a worker crash and a retry.
    return dag.test(logical_date=logical_date, run_after=logical_date)


def retry_run(dag: Any, logical_date: datetime.datetime) -> Any:
    """The scheduler after a worker died mid-task: that try fails, the next try of each unfinished
    task instance runs (here at once, where the scheduler would wait retry_delay)."""
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    sync_to_db(dag)
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag.dag_id, logical_date=logical_date).one()
        for ti in run.get_task_instances(session=session):
            if ti.state in (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED):
                continue
            ti.prepare_db_for_next_try(session)
            ti.try_number += 1
            ti.state = TaskInstanceState.SCHEDULED
            session.commit()
            _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
        session.expire_all()
        states = {ti.state for ti in run.get_task_instances(session=session)}
        run.state = DagRunState.SUCCESS if states == {TaskInstanceState.SUCCESS} else DagRunState.FAILED
        session.commit()
        return run


def main(dag_file: str, dag_id: str, logical_date: str | None = None, *flags: str) -> int:
    if "--external-triggerer" in flags:
        leave_triggers_to_a_triggerer()
    spec = importlib.util.spec_from_file_location("dag_under_test", dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    assert dag.dag_id == dag_id
    when = datetime.datetime.fromisoformat(logical_date) if logical_date else None
    run = retry_run(dag, when) if "--retry" in flags else run_dag(dag, when)
    print(f"DAG-RUN-STATE {run.state}", flush=True)
    return 0 if str(run.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
