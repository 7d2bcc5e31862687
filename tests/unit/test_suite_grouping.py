"""scripts/test-suite runs the integration tests with `pytest -n 5 --dist loadgroup`, and counts on an
`xdist_group` mark keeping tests on one worker (each lane of the tests that start Airflow, a database, a
worker and a triggerer each, one after the other: tests/conftest.py). Whether it does depends on the installed
pytest and pytest-xdist: with pytest 9.2 and xdist 3.8 the mark was silently ignored."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

GROUPED_AND_NOT = textwrap.dedent("""
    import os
    import time

    import pytest


    @pytest.mark.xdist_group("together")
    @pytest.mark.parametrize("case", ["a", "b", "c"])
    def test_grouped(case):
        time.sleep(0.3)
        with open(os.environ["RAN_LOG"], "a") as log:
            log.write(f"RAN {case} ON {os.environ['PYTEST_XDIST_WORKER']}\\n")


    @pytest.mark.parametrize("case", range(6))
    def test_free(case):
        time.sleep(0.3)
""")


def test_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouping.py").write_text(GROUPED_AND_NOT)
    ran = tmp_path / "ran.log"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=dict(os.environ, RAN_LOG=str(ran)))
    assert result.returncode == 0, result.stdout + result.stderr
    workers = dict(re.findall(r"RAN (\w) ON (gw\d+)", ran.read_text()))
    assert sorted(workers) == ["a", "b", "c"], ran.read_text()
    assert len(set(workers.values())) == 1, f"the grouped tests ran on {workers}"
