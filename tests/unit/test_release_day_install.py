"""The provider's wheel installs into each supported Airflow's release-day package set changing nothing.

Companies install Airflow with its constraints file, made as of the release's day, and then add providers
to that set. A floor above what a release's set holds (as `apache-airflow-providers-cncf-kubernetes>=10.25`
once was: 3.3.2's set holds 10.22.0) makes pip upgrade packages under the other providers, or refuse.
Each set here is `make`'s resolution of pyproject.toml as of a release's day (constraints-airflow-*.txt),
plus the floors' own (constraints-lowest.txt). The test builds the wheel, puts exactly one set into a
fresh venv, installs the wheel with pip as a user would, and compares every package before and after.

Offline: `make venv` built a venv from each set, so uv's cache holds every package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")
RELEASE_DAY_SETS = sorted(REPO.glob("constraints-airflow-*.txt")) + [REPO / "constraints-lowest.txt"]


def run(*command: str | Path) -> str:
    # Without this process's PYTHONPATH: a source tree on it would show as installed.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, env=env)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


# What the wheel is built from (pyproject.toml's package find and package data, its readme and license).
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "airflow_volcano"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # From a copy: setuptools writes build/ and *.egg-info into the tree it builds, and two test workers
    # (pytest-xdist) may each build at once.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    run(UV, "build", "-q", "--offline", "--wheel", "-o", out, source)
    (built,) = out.glob("airflow_volcano-*.whl")
    return built


def installed(python: Path) -> dict[str, str]:
    listed = json.loads(run(sys.executable, "-m", "pip", "--python", python, "list", "--format", "json"))
    return {package["name"].lower(): package["version"] for package in listed}


def test_there_is_a_release_day_set_for_each_supported_minor():
    assert {path.name for path in RELEASE_DAY_SETS} >= {
        "constraints-airflow-3.2.txt", "constraints-airflow-3.3.txt", "constraints-lowest.txt"}


@pytest.mark.parametrize("package_set", RELEASE_DAY_SETS, ids=lambda path: path.stem)
def test_the_wheel_installs_into_the_release_day_set_changing_no_package(wheel, package_set, tmp_path):
    venv = tmp_path / "venv"
    run(UV, "venv", "-q", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    # Exactly the set, as an image built with that constraints file holds it.
    run(UV, "pip", "sync", "-q", "--offline", "--python", python, package_set)
    before = installed(python)
    # pip, not uv: what the official image and most deployments run. No index: every requirement must be
    # met by what is there already; one that is not fails here instead of upgrading something.
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", wheel)
    after = installed(python)
    assert after.pop("airflow-volcano") == wheel.name.split("-")[1]
    changed = {name: (before.get(name), after.get(name))
               for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
    assert not changed, f"installing the wheel into {package_set.name} changed (before, after): {changed}"
