"""A migrated metadata database for a test's Airflow home, as a deployment's first start leaves it:
migrated (`airflow db migrate`) and its DAG bundles registered (the dag-processor's first act).

Every test that runs Airflow's own processes (a triggerer, an api-server, a worker of its own) needs a
fresh metadata database. Migrating one takes about 4 s of a core on Airflow 3.3 and 6 s (18 s of wall
time) on 3.1, and the result is the same file for every home: so each Airflow venv's database is
migrated once, and each test gets a copy. The copy is keyed by the venv and the time `make venv` last
installed it (its `.installed` stamp), so an upgraded Airflow migrates again.

The bundles are registered here because a test's workers start together: each registers the bundles
it finds missing, and two inserting the same one at once fail on its unique name.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

CACHE = Path(tempfile.gettempdir()) / "airflow-volcano-migrated-db"


REGISTER_BUNDLES = ("from airflow.dag_processing.bundles.manager import DagBundlesManager; "
                    "DagBundlesManager().sync_bundles_to_db()")


def _migrate_here(python: str | Path, env: Mapping[str, str], timeout: float) -> None:
    for command in (["-m", "airflow", "db", "migrate"], ["-c", REGISTER_BUNDLES]):
        subprocess.run([str(python), *command], env=dict(env), check=True, capture_output=True, timeout=timeout)


def migrate(python: str | Path, env: Mapping[str, str], timeout: float = 300) -> None:
    """`airflow db migrate` of env's AIRFLOW_HOME with that Airflow's `python`, and its DAG bundles
    registered: a copy of a database it made before, else made now (and kept). A database elsewhere than
    the home's `airflow.db` (another SQL_ALCHEMY_CONN) is made as asked."""
    if env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        _migrate_here(python, env, timeout)
        return
    venv = Path(python).parent.parent
    stamp = venv / ".installed"
    installed = stamp.stat().st_mtime_ns if stamp.exists() else "never"
    auth_manager = env.get("AIRFLOW__CORE__AUTH_MANAGER", "")  # one may add tables of its own
    bundles = env.get("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", "")
    key = hashlib.sha256(repr((str(venv), installed, auth_manager, bundles)).encode()).hexdigest()[:16]
    migrated = CACHE / key / "airflow.db"
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers wanting the same release's: one migrates
        if not migrated.exists():
            with tempfile.TemporaryDirectory(dir=CACHE) as home:
                _migrate_here(python, {**env, "AIRFLOW_HOME": home}, timeout)
                migrated.parent.mkdir(exist_ok=True)
                os.replace(Path(home) / "airflow.db", migrated)
    target = Path(env["AIRFLOW_HOME"])
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated, target / "airflow.db")
