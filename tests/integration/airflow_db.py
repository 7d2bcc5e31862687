"""A migrated metadata database for a test's Airflow home, as `airflow db migrate` makes it.

Every test that runs Airflow's own processes (a triggerer, an api-server, a worker of its own) needs a
fresh metadata database. Migrating one takes about 4 s of a core on Airflow 3.3 and 6 s (18 s of wall
time) on 3.1, and the result is the same file for every home: so each Airflow venv's database is
migrated once, and each test gets a copy. The copy is keyed by the venv and the time `make venv` last
installed it (its `.installed` stamp), so an upgraded Airflow migrates again.
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


def migrate(python: str | Path, env: Mapping[str, str], timeout: float = 300) -> None:
    """`airflow db migrate` of env's AIRFLOW_HOME with that Airflow's `python`: a copy of a database it
    migrated before, else migrated now (and kept). A database elsewhere than the home's `airflow.db`
    (another SQL_ALCHEMY_CONN) is migrated as asked."""
    if env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        subprocess.run([str(python), "-m", "airflow", "db", "migrate"], env=dict(env), check=True,
                       capture_output=True, timeout=timeout)
        return
    venv = Path(python).parent.parent
    stamp = venv / ".installed"
    installed = stamp.stat().st_mtime_ns if stamp.exists() else "never"
    auth_manager = env.get("AIRFLOW__CORE__AUTH_MANAGER", "")  # one may add tables of its own
    key = hashlib.sha256(repr((str(venv), installed, auth_manager)).encode()).hexdigest()[:16]
    migrated = CACHE / key / "airflow.db"
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers wanting the same release's: one migrates
        if not migrated.exists():
            with tempfile.TemporaryDirectory(dir=CACHE) as home:
                subprocess.run([str(python), "-m", "airflow", "db", "migrate"], env={**env, "AIRFLOW_HOME": home},
                               check=True, capture_output=True, timeout=timeout)
                migrated.parent.mkdir(exist_ok=True)
                os.replace(Path(home) / "airflow.db", migrated)
    target = Path(env["AIRFLOW_HOME"])
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated, target / "airflow.db")
