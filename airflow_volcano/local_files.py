"""The local files a task reads as it builds its Job (`training_script`, a `job_template` file), and the
folders it may read them from.

A rendered path comes from whoever triggers the DAG run, so a file is read only from inside the DAG
file's folder, the DAG's template_searchpath (as Airflow's own template files), `allowed_file_dirs`,
and the deployment's `[volcano] allowed_file_dirs` and connection extra: `../` may not leave them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_volcano.compat import conf
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.manifest import TrainingScript, load_job_template

TEMPLATE_EXTENSIONS = (".yaml", ".yml", ".json")
# The option (in [volcano] and in a connection's extras) naming more folders files may be read from.
ALLOWED_FILE_DIRS_OPTION = "allowed_file_dirs"


def file_folders(allowed_file_dirs: Sequence[str] | None, connection_extra: Callable[[], Any],
                 dag: Any) -> list[Path]:
    """Where `training_script` and `job_template` may be read from: the DAG file's folder and its
    template_searchpath, `allowed_file_dirs`, and the deployment's (`connection_extra` reads the
    connection's extra of that name); without a DAG, the working directory."""
    folders = [Path(folder) for folder in [*(allowed_file_dirs or []), *deployment_file_dirs(connection_extra)]]
    if dag is not None:
        if dag.fileloc:
            folders.insert(0, Path(dag.fileloc).parent)
        searchpath = dag.template_searchpath or []
        folders += [Path(folder) for folder in ([searchpath] if isinstance(searchpath, str) else searchpath)]
    else:
        folders.append(Path.cwd())
    return [Path(os.path.normpath(folder.absolute())) for folder in folders]


def deployment_file_dirs(connection_extra: Callable[[], Any]) -> list[str]:
    """The folders a deployment allows for every task: `[volcano] allowed_file_dirs` and the
    connection's extra of that name (a list, or a comma-separated text), each absolute."""
    found: list[str] = []
    setting = conf.get("volcano", ALLOWED_FILE_DIRS_OPTION, fallback="") or ""
    for where, value in ((f"[volcano] {ALLOWED_FILE_DIRS_OPTION}", setting),
                         (f"connection extra {ALLOWED_FILE_DIRS_OPTION}", connection_extra())):
        items = value if isinstance(value, list | tuple) else str(value or "").split(",")
        for item in (str(item).strip() for item in items):
            if item and not os.path.isabs(item):
                raise JobSpecError(f"{where}: {item!r} is not an absolute folder path")
            if item:
                found.append(item)
    return found


def local_path(parameter: str, value: str, folders: list[Path]) -> Path:
    """A local file named in a (rendered) argument: relative to one of `folders`, or absolute inside one."""
    path = Path(value)
    candidates = [path] if path.is_absolute() else [folder / path for folder in folders]
    inside = [Path(os.path.normpath(candidate)) for candidate in candidates]
    inside = [candidate for candidate in inside if any(candidate.is_relative_to(folder) for folder in folders)]
    if not inside:
        raise JobSpecError(
            f"{parameter}: {value!r} is outside the folders files are read from "
            f"({', '.join(map(str, folders))}: the DAG file's folder and the DAG's template_searchpath); "
            "name a file there, or add its folder to allowed_file_dirs")
    return next((candidate for candidate in inside if candidate.exists()), inside[0])


def read_training_script(value: str | None, folders: Callable[[], list[Path]]) -> TrainingScript | None:
    """The script `training_script` names, read (`folders` are asked only when there is one)."""
    if not value:
        return None
    path = local_path("training_script", value, folders())
    try:
        return TrainingScript(filename=path.name, content=path.read_text())
    except OSError as error:
        raise JobSpecError(f"training_script: cannot read {str(path)!r}: {error.strerror or error}") from error


def job_template_text(value: str, folders: Callable[[], list[Path]],
                      render: Callable[[str], str] | None) -> tuple[str, str]:
    """The template's text and where it came from: a file (rendered with Jinja by `render`, as Airflow
    renders template files) when `value` names one, else the string itself."""
    if not value.strip().endswith(TEMPLATE_EXTENSIONS) or "\n" in value.strip():
        return value, "<string>"
    path = local_path("job_template", value.strip(), folders())
    try:
        text = path.read_text()
    except OSError as error:
        raise JobSpecError(f"job_template: cannot read {str(path)!r}: {error.strerror or error}") from error
    if render is not None:
        text = render(text)
    return text, str(path)


def parsed_job_template(value: str | dict | None, folders: Callable[[], list[Path]],
                        render: Callable[[str], str] | None) -> dict | None:
    """`job_template` as the Job dict it describes: a dict as is, a file or text parsed."""
    if value is None or isinstance(value, dict):
        return value
    text, source = job_template_text(str(value), folders, render)
    return load_job_template(text, source=source)
