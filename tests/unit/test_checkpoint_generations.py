"""The checkpoint rule of docs/failures.md "Checkpoints and resuming", as the example script follows it: a rank left
running on a node cut off from the cluster (a partition) must not keep writing the checkpoints of a gang
that restarted without it, or of a later try. Real processes of the example script's own functions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "dags" / "scripts"


def gang(checkpoints: Path, try_number: int, restarts: int, code: str) -> str:
    """`code` run by a rank of the generation (try_number, restarts), in its own process."""
    env = {**os.environ, "CHECKPOINT_DIR": str(checkpoints), "AIRFLOW_TRY_NUMBER": str(try_number),
           "VOLCANO_RESTART_COUNT": str(restarts)}
    done = subprocess.run([sys.executable, "-c", f"import train_resumable as t; print({code})"], cwd=SCRIPTS,
                          env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_newest_generation_owns_the_checkpoints_and_an_older_one_stops_writing(tmp_path):
    assert gang(tmp_path, 1, 0, "t.claim_checkpoints()") == "True"
    assert gang(tmp_path, 1, 1, "t.claim_checkpoints()") == "True", "the gang Volcano restarted"
    assert gang(tmp_path, 1, 0, "t.may_write_checkpoints()") == "False", "the ranks of the partitioned node"
    assert gang(tmp_path, 1, 0, "t.claim_checkpoints()") == "False", "and a claim of theirs changes nothing"
    assert gang(tmp_path, 1, 1, "t.may_write_checkpoints()") == "True"
    assert gang(tmp_path, 2, 0, "t.claim_checkpoints()") == "True", "a later try of the task: restarts count anew"
    assert gang(tmp_path, 1, 1, "t.may_write_checkpoints()") == "False"
    assert gang(tmp_path, 2, 0, "t.newest_generation()") == "(2, 0)"


def test_claims_made_at_once_leave_one_newest_generation(tmp_path):
    """Claims are files added, never overwritten: however two rank 0s interleave, both agree which is newer."""
    claims = [subprocess.Popen([sys.executable, "-c", "import train_resumable as t; t.claim_checkpoints()"],
                               cwd=SCRIPTS, env={**os.environ, "CHECKPOINT_DIR": str(tmp_path),
                                                 "AIRFLOW_TRY_NUMBER": "1", "VOLCANO_RESTART_COUNT": str(restarts)})
              for restarts in range(6)]
    assert all(claim.wait(timeout=60) == 0 for claim in claims)
    assert [gang(tmp_path, 1, restarts, "t.may_write_checkpoints()") for restarts in range(6)] == (
        ["False"] * 5 + ["True"])
