"""What an Airflow worker process of the integration tests costs, started anew or forked warm.

    .venv/bin/python benchmarks/worker_start.py [--runs N]

Runs a one-task DAG (an EmptyOperator) N times through tests/integration/dag_runner.py (dag.test(), the
task runner and the in-process execution API, as the tests' workers do), each in a process of its own:
started anew (a new interpreter importing Airflow), then forked from a zygote that has done the imports
(tests/integration/warm_worker.py). Prints the CPU seconds per run of each, and the zygote's own start.
Uses a fresh AIRFLOW_HOME (its SQLite metadata DB migrated first). Run it alone: the machine has 2 cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DAG = textwrap.dedent("""
    import datetime
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG
    with DAG("worker_start", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
        EmptyOperator(task_id="noop")
""")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    home = Path(tempfile.mkdtemp(prefix="worker-start-"))
    os.environ.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False", PYTHONUNBUFFERED="1")
    subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], check=True,
                   capture_output=True)
    dag = home / "worker_start.py"
    dag.write_text(DAG)
    log = home / "worker.log"
    from tests.integration import warm_worker

    before = children_cpu()
    for _ in range(runs):
        with log.open("ab") as out:
            assert subprocess.run([sys.executable, str(warm_worker.RUNNER), str(dag), "worker_start"], stdout=out,
                                  stderr=subprocess.STDOUT).returncode == 0, log.read_text()[-3000:]
    cold = (children_cpu() - before) / runs

    def zygote_with(forks: int) -> float:
        """The CPU of a zygote and `forks` runs forked from it (all its children, once it has ended)."""
        start = children_cpu()
        zygote = warm_worker.Zygote(sys.executable, dict(os.environ))
        for _ in range(forks):
            process = warm_worker.WarmProcess(zygote, zygote.fork([str(dag), "worker_start"], dict(os.environ), log),
                                              [])
            assert process.wait(timeout=600) == 0, log.read_text()[-3000:]
        zygote.close()
        return children_cpu() - start

    alone = zygote_with(0)
    warm = (zygote_with(runs) - alone) / runs
    print(f"a worker started anew:  {cold:5.1f} CPU-s a run ({runs} runs)")
    print(f"a worker forked warm:   {warm:5.1f} CPU-s a run ({runs} runs), after the zygote's start: {alone:.1f} CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
