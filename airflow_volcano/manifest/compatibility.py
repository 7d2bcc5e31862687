"""What the cluster's Volcano release can do, and fitting a Job to it before it is submitted.

Two of the pytorch plugin's behaviours changed across releases (../shared/volcano-notes.md):

- before v1.12 it counts every task's replicas in WORLD_SIZE, so a Job with a task besides master and
  workers (tensorboard=, an evaluator in a template) tells the ranks to wait for a rank that never
  comes: a hang, not an error;
- the `--wait-master-*` flags exist from v1.14; an older plugin logs an unknown flag and stops parsing,
  so every flag after it is silently dropped.

The release is learned from the Job CRD's schema, which changed at exactly those two releases
(`spec.networkTopology` from v1.12, `spec.tasks[].partitionPolicy` from v1.14) and which any user
of the cluster may read (the apiserver's OpenAPI document); a connection extra or the
`[volcano] volcano_version` setting overrides it. Pure: the hook reads the schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.manifest.launchers import WAIT_MASTER_FLAGS
from airflow_volcano.manifest.names import DEFAULT_MASTER, DEFAULT_WORKER, plugin_arg
from airflow_volcano.manifest.pod_runtime import forwarded

VERSION_OPTION = "volcano_version"  # the connection extra and the [volcano] setting
WORLD_SIZE_ENV = "AIRFLOW_VOLCANO_WORLD_SIZE"  # forward-signals.sh exports it as WORLD_SIZE
RANKS_ONLY_WORLD_SIZE = (1, 12)
WAIT_MASTER_FLAGS_SINCE = (1, 14)
# The pytorch plugin's flags added after --master, --worker and --port, and the release that added
# them (Go's flag package: -x or --x).
NEWER_PYTORCH_FLAGS = {flag.strip("-="): WAIT_MASTER_FLAGS_SINCE for flag in WAIT_MASTER_FLAGS}
VOLCANO_VERSION_HINT = f"{VERSION_OPTION} (e.g. \"1.14\") or the [volcano] {VERSION_OPTION} setting"
VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


def release(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


@dataclass(frozen=True)
class VolcanoFeatures:
    """The cluster's Volcano release, as far as the provider depends on it: a range of releases.

    :param oldest: the oldest release it can be, as (major, minor); None if unknown.
    :param before: the first release it cannot be (None: no upper bound).
    :param source: how it was learned, for messages.
    """

    oldest: tuple[int, int] | None
    before: tuple[int, int] | None
    source: str

    @classmethod
    def from_version(cls, text: str, source: str) -> VolcanoFeatures:
        match = VERSION.match(str(text).strip())
        if match is None:
            raise JobSpecError(f"{VERSION_OPTION}: {text!r} is not a Volcano release such as 1.10 or v1.14.1 "
                               f"({source})")
        major, minor = int(match.group(1)), int(match.group(2))
        return cls((major, minor), (major, minor + 1), source)

    @classmethod
    def from_job_schema(cls, schema: dict, source: str) -> VolcanoFeatures:
        """From the OpenAPI schema of the Job kind (the object with its `properties`)."""
        spec = ((schema.get("properties") or {}).get("spec") or {}).get("properties") or {}
        task = ((spec.get("tasks") or {}).get("items") or {}).get("properties") or {}
        if "partitionPolicy" in task:
            return cls(WAIT_MASTER_FLAGS_SINCE, None, source)
        if "networkTopology" in spec:
            return cls(RANKS_ONLY_WORLD_SIZE, WAIT_MASTER_FLAGS_SINCE, source)
        return cls((1, 0), RANKS_ONLY_WORLD_SIZE, source)

    @classmethod
    def unknown(cls, reason: str) -> VolcanoFeatures:
        return cls(None, None, reason)

    def at_least(self, version: tuple[int, int]) -> bool | None:
        """Whether the release is `version` or later; None when the signal cannot tell."""
        if self.oldest is not None and self.oldest >= version:
            return True
        if self.before is not None and self.before <= version:
            return False
        return None

    def describe(self) -> str:
        """The release as a noun phrase with its source: "Volcano before 1.12 (the Job CRD's schema)"."""
        if self.oldest is None:
            return f"an unknown Volcano release ({self.source})"
        if self.before == (self.oldest[0], self.oldest[1] + 1):
            return f"Volcano {release(self.oldest)} ({self.source})"
        if self.before is None:
            return f"Volcano {release(self.oldest)} or later ({self.source})"
        if self.oldest == (1, 0):
            return f"Volcano before {release(self.before)} ({self.source})"
        return f"Volcano {release(self.oldest)} to before {release(self.before)} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        return {"oldest": list(self.oldest) if self.oldest else None,
                "before": list(self.before) if self.before else None, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VolcanoFeatures:
        def pair(value: Any) -> tuple[int, int] | None:
            return (int(value[0]), int(value[1])) if value else None

        return cls(pair(data.get("oldest")), pair(data.get("before")), str(data.get("source") or ""))


def _plugin_flags(arguments: list[Any]) -> list[tuple[str, str]]:
    """(flag name, as written) for each flag among the plugin's arguments."""
    flags = []
    for argument in map(str, arguments):
        if argument.startswith("-"):
            flags.append((argument.lstrip("-").split("=", 1)[0], argument))
    return flags


def fit_to_volcano(job: dict, features: VolcanoFeatures) -> list[str]:
    """Make `job` right for the cluster's Volcano, or raise JobSpecError naming what it cannot run.
    Returns what was adapted, one sentence each, for the task log. Idempotent."""
    plugins = (job.get("spec") or {}).get("plugins") or {}
    if "pytorch" not in plugins:
        return []
    arguments = list(plugins.get("pytorch") or [])
    for name, written in _plugin_flags(arguments):
        since = NEWER_PYTORCH_FLAGS.get(name)
        if since is None or features.at_least(since):  # (a flag we do not know: Volcano's to judge)
            continue
        what = (f"wait_for_master (the pytorch plugin's {written!r})" if name.startswith("wait-master")
                else f"the pytorch plugin's flag {written!r}")
        if features.at_least(since) is None:
            raise JobSpecError(f"{what} needs Volcano >= {release(since)}, and this cluster's release could not be "
                               f"learned ({features.source}); set the connection extra {VOLCANO_VERSION_HINT}")
        raise JobSpecError(f"{what} needs Volcano >= {release(since)}; this cluster runs {features.describe()}. "
                           "An older pytorch plugin stops reading its flags at one it does not know and drops the "
                           "rest silently")
    return _fit_world_size(job, features)


def _fit_world_size(job: dict, features: VolcanoFeatures) -> list[str]:
    if features.at_least(RANKS_ONLY_WORLD_SIZE):
        return []
    master = plugin_arg(job, "master") or DEFAULT_MASTER  # as validate_job reads the plugin's roles
    worker = plugin_arg(job, "worker") or DEFAULT_WORKER
    tasks = (job.get("spec") or {}).get("tasks") or []
    rank_tasks = [task for task in tasks if task.get("name") in (master, worker)]
    extra = [str(task.get("name")) for task in tasks
             if task.get("name") not in (master, worker) and int(task.get("replicas") or 0) > 0]
    if not extra:
        return []
    world_size = sum(int(task.get("replicas") or 0) for task in rank_tasks)
    counted = world_size + sum(int(task.get("replicas") or 0) for task in tasks if task.get("name") in extra)
    for task in rank_tasks:
        containers = (((task.get("template") or {}).get("spec") or {}).get("containers") or [])
        if not containers:
            continue
        container = containers[0]
        if not forwarded(container.get("command") or []):
            raise JobSpecError(
                f"task {task.get('name')!r} besides task(s) {', '.join(extra)}: this cluster runs "
                f"{features.describe()}, whose pytorch plugin counts every task in WORLD_SIZE ({counted} instead of "
                f"{world_size}): the ranks would wait for ranks that never come. The operator corrects WORLD_SIZE "
                f"through the command it runs, and container {container.get('name')!r} has none it runs (the image's "
                "entrypoint, full_job_spec or debug): give it a command, run the extra tasks in a Job of their own, "
                "or use Volcano >= 1.12")
        env = container.setdefault("env", [])
        env[:] = [item for item in env if item.get("name") != WORLD_SIZE_ENV]
        env.append({"name": WORLD_SIZE_ENV, "value": str(world_size)})
    return [f"This cluster runs {features.describe()}, which counts task(s) {', '.join(extra)} in WORLD_SIZE "
            f"({counted}): the ranks of tasks {master} and {worker} get WORLD_SIZE={world_size} from the operator "
            "instead"]
