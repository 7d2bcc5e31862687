"""A chaos soak: many training task instances through real Airflow services while seeded faults strike at
random times and in combination; then the provider's promises are checked as invariants.

    .venv/bin/python benchmarks/chaos_soak.py --size small      what make test runs (30 task instances)
    .venv/bin/python benchmarks/chaos_soak.py --size full       make soak (320 task instances, about an hour)
    .venv/bin/python benchmarks/chaos_soak.py --size full --seed 1234     replay a seed

The Airflow services are docker-compose.yaml's (PostgreSQL, api-server, scheduler with the LocalExecutor,
dag-processor, triggerer) run as processes (tests/compose_stack.py); the tasks reach the apiserver through
tests/integration/faults.py's proxy with a ServiceAccount token, as a deployment would, and the cluster is
the local one (scripts/volcano-cluster): kwok's simulated pods for most task instances, the real node for a
few trainings. The DAG is benchmarks/chaos_soak_dag.py; each DAG run maps one task instance per case.

The seed fixes the cases (operator, worker or triggerer, what the pods do) and the fault schedule (when,
which kind, which pick among the task instances running then). What is running at a given second still
depends on the machine's speed, so a replay strikes the same kinds at the same times, not always the same
task instances. The seed is printed first; the report lands in .artifacts/chaos-soak/.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import httpx  # noqa: E402
import volcano_cluster  # noqa: E402 (where the local cluster's etcd listens)
import yaml  # noqa: E402
from kubernetes import client, config, utils  # noqa: E402

from tests.compose_stack import Stack, compose_stack, login, signed_in, unpause  # noqa: E402
from tests.integration.conftest import grant_queue_reader, revoke_queue_reader  # noqa: E402
from tests.integration.faults import FaultyProxy  # noqa: E402

CLUSTER = REPO / "scripts" / "volcano-cluster"
ARTIFACTS = REPO / ".artifacts" / "chaos-soak"
DAG_ID = "chaos_soak"
SIM = "sim.airflow-volcano.io/"
IDENTITY = ("dag-id", "task-id", "run-id", "map-index")
LABEL_PREFIX = "airflow-volcano.io/"
FAILED_PHASES = {"Failed", "Terminated", "Aborted"}
FINAL_PHASES = FAILED_PHASES | {"Completed"}
KINDS = ("pytorch", "generic", "deepspeed", "real")


@dataclasses.dataclass(frozen=True)
class Size:
    runs: int
    per_run: dict[str, int]  # task instances of each kind in a DAG run
    faults: int
    window: float  # seconds over which the faults are spread
    run_interval: float  # seconds between two DAG runs' triggers
    # Seconds after the last trigger by which every run must have ended: a task instance struck on several
    # tries may use all four, one of them waiting 120 s for pods Volcano never made (seed 2026 did: 360 s
    # was too short for it, though it ended as expected).
    deadline: float
    every_kind: bool = False  # each fault kind at least once, the rest drawn (else all drawn by their shares)


SIZES = {
    "small": Size(runs=3, per_run={"pytorch": 4, "generic": 3, "deepspeed": 2, "real": 1}, faults=14, window=200,
                  run_interval=15, deadline=480, every_kind=True),
    "full": Size(runs=32, per_run={"pytorch": 4, "generic": 3, "deepspeed": 2, "real": 1}, faults=150, window=2800,
                 run_interval=90, deadline=900),
}
# Each fault kind's share of the schedule.
FAULT_KINDS = {
    "kill-9 worker": 3, "kill-9 triggerer": 2,
    "restart kube-apiserver": 1, "restart etcd": 1, "restart vc-controller-manager": 1, "restart vc-scheduler": 1,
    "429 burst": 2, "5xx burst": 2, "latency": 2, "watch streams cut": 2, "expired token": 1,
    "lost node": 1, "mark failed": 2, "clear": 2,
}
# What the operators are told (benchmarks/chaos_soak_dag.py reads these from soak-settings.json).
RETRIES = 3
RETRY_DELAY = 3
EXECUTION_TIMEOUT = 600
STARTUP_TIMEOUT = 300
# How far past its execution_timeout a try may last before it counts as a hang: the time to kill it and
# for the scheduler to notice a dead worker (task_instance_heartbeat_timeout below) and a loaded machine.
SLACK = 120
HEARTBEAT_TIMEOUT = 60


# ---------------------------------------------------------------------------------------------
# The plan: cases and faults, from the seed
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    run_id: str
    kind: str
    map_index: int
    deferrable: bool
    outcome: str  # "succeed" or "fail"
    exit_code: int
    seconds: int
    # What happened to it (filled as the soak goes): faults that struck it, user actions in order.
    struck: list[str] = dataclasses.field(default_factory=list)
    actions: list[str] = dataclasses.field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, int]:
        return self.run_id, self.kind, self.map_index

    @property
    def name(self) -> str:
        return f"{self.run_id}/{self.kind}[{self.map_index}]"

    @property
    def expected_state(self) -> str:
        if self.actions and self.actions[-1] == "mark failed":
            return "failed"
        return "success" if self.outcome == "succeed" else "failed"

    def kwargs(self) -> dict[str, Any]:
        """The mapped operator's arguments for this case."""
        kwargs: dict[str, Any] = {"deferrable": self.deferrable}
        if self.kind == "real":
            kwargs["env"] = {"SOAK_SECONDS": str(self.seconds), "SOAK_EXIT": str(self.exit_code)}
        else:
            sim = {"run-for": f"{self.seconds}s"}
            if self.outcome == "fail":
                sim.update(outcome="fail", **{"exit-code": str(self.exit_code)})
            kwargs["annotations"] = {SIM + key: value for key, value in sim.items()}
        return kwargs


@dataclasses.dataclass
class Fault:
    at: float  # seconds after the first trigger
    kind: str
    pick: float  # which of the candidates then (a fraction, so the seed chooses it)
    target: str = ""
    outcome: str = ""  # what applying it did
    applied_at: float = 0.0


def plan(seed: int, size: Size) -> tuple[list[Case], list[Fault]]:
    rng = random.Random(seed)
    cases = []
    for run in range(size.runs):
        run_id = f"soak-{seed}-{run:03d}"
        for kind, count in size.per_run.items():
            for index in range(count):
                fails = rng.random() < 0.2
                cases.append(Case(run_id, kind, index, deferrable=rng.random() < 0.5,
                                  outcome="fail" if fails else "succeed",
                                  exit_code=rng.choice([2, 3, 7]) if fails else 0,
                                  seconds=rng.randint(5, 30) if kind != "real" else rng.randint(5, 20)))
    kinds = list(FAULT_KINDS)
    weights = [FAULT_KINDS[kind] for kind in kinds]
    faults = [Fault(at=rng.uniform(10, size.window), kind=rng.choices(kinds, weights)[0], pick=rng.random())
              for _ in range(size.faults)]
    if size.every_kind:  # each kind at least once: the first draws are replaced by one of each
        for fault, kind in zip(faults, kinds, strict=False):
            fault.kind = kind
    return cases, sorted(faults, key=lambda fault: fault.at)


# ---------------------------------------------------------------------------------------------
# The continuous check: never two Jobs at once for one task instance
# ---------------------------------------------------------------------------------------------


def try_label(job: dict[str, Any]) -> int | None:
    value = (job["metadata"].get("labels") or {}).get(LABEL_PREFIX + "try-number", "")
    return int(value) if value.isdigit() else None


def identity(job: dict[str, Any]) -> tuple[str, str, int] | None:
    labels = job["metadata"].get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") != "airflow-volcano":
        return None
    run_id, task_id, index = (labels.get(LABEL_PREFIX + key) for key in ("run-id", "task-id", "map-index"))
    if not (run_id and task_id and index and index.isdigit()):
        return None
    return run_id, task_id, int(index)


class JobWatch:
    """Every Volcano Job of the namespace, from a watch of etcd, where the apiserver keeps them: which Jobs
    each task instance had, and every moment it had two live at once. Live: not in a final phase (a failed
    Job kept for its logs runs nothing) and not being deleted. etcd, not the apiserver: after a restart of
    kube-apiserver its watch cache cannot resume an older watch (410: too old resource version), and a
    relist does not show a Job created and deleted in the gap (found by the soak: a 5 s Job between two
    restarts). etcd's own watch resumes from the last revision seen across restarts of either, so it misses
    nothing unless that revision was compacted (then it relists, and counts a break)."""

    def __init__(self, namespace: str, clock: Callable[[], float]) -> None:
        self.namespace = namespace
        self.clock = clock
        self.live: dict[str, tuple[tuple[str, str, int], str]] = {}  # uid -> (task instance, Job name)
        self.seen: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = defaultdict(dict)  # uid -> last state
        self.overlaps: list[tuple[float, tuple[str, str, int], list[str]]] = []
        self.breaks = 0
        self._prefix = f"/registry/batch.volcano.sh/jobs/{namespace}/".encode()
        self._etcd = httpx.Client(base_url=f"http://{volcano_cluster.HOST}:{volcano_cluster.PORTS['etcd']}",
                                  timeout=httpx.Timeout(10.0))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> JobWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._etcd.close()

    def _range(self) -> dict[str, Any]:
        return self._etcd.post("/v3/kv/range", json=self._keys()).raise_for_status().json()

    def _keys(self) -> dict[str, str]:
        end = self._prefix[:-1] + bytes([self._prefix[-1] + 1])
        return {"key": base64.b64encode(self._prefix).decode(), "range_end": base64.b64encode(end).decode()}

    def _observe(self, job: dict[str, Any], deleted: bool = False) -> None:
        ti = identity(job)
        if ti is None:
            return
        uid, name = job["metadata"]["uid"], job["metadata"]["name"]
        phase = ((job.get("status") or {}).get("state") or {}).get("phase", "")
        with self._lock:
            self.seen[ti][uid] = {"name": name, "phase": phase, "deleted": deleted,
                                  "try": (job["metadata"].get("labels") or {}).get(LABEL_PREFIX + "try-number")}
            if deleted or job["metadata"].get("deletionTimestamp") or phase in FINAL_PHASES:
                self.live.pop(uid, None)
                return
            known = uid in self.live
            self.live[uid] = (ti, name)
            mine = sorted(other_name for other_ti, other_name in self.live.values() if other_ti == ti)
            if len(mine) > 1 and not known:  # recorded when it begins
                self.overlaps.append((self.clock(), ti, mine))

    def _relist(self) -> int:
        """The Jobs there now (a Job gone since is marked deleted); returns the revision to watch from."""
        listed = self._range()
        jobs = [json.loads(base64.b64decode(kv["value"])) for kv in listed.get("kvs", [])]
        with self._lock:
            present = {job["metadata"]["uid"] for job in jobs}
            for uid in [uid for uid in self.live if uid not in present]:
                self.live.pop(uid)
                for seen in self.seen.values():
                    if uid in seen:
                        seen[uid]["deleted"] = True
        for job in jobs:
            self._observe(job)
        return int(listed["header"]["revision"]) + 1

    def _run(self) -> None:
        revision = None
        while not self._stop.is_set():
            try:
                if revision is None:
                    revision = self._relist()
                request = {"create_request": {**self._keys(), "start_revision": revision, "prev_kv": True}}
                # Idle for the read timeout: reopened from the next revision, which loses nothing.
                with self._etcd.stream("POST", "/v3/watch", json=request) as response:
                    response.raise_for_status()
                    for line in response.iter_lines():
                        if self._stop.is_set():
                            return
                        result = json.loads(line).get("result") or {}
                        if result.get("compact_revision") or result.get("canceled"):
                            revision = None  # its history is gone: relist, blind to what happened in between
                            self.breaks += 1
                            break
                        for event in result.get("events") or []:
                            if event.get("type") == "DELETE":
                                if "prev_kv" in event:
                                    self._observe(json.loads(base64.b64decode(event["prev_kv"]["value"])), True)
                            else:
                                self._observe(json.loads(base64.b64decode(event["kv"]["value"])))
                            revision = int(event["kv"]["mod_revision"]) + 1
            except httpx.ReadTimeout:
                continue
            except Exception:  # noqa: BLE001 (etcd restarting: resume from the revision reached)
                self._stop.wait(1)


# ---------------------------------------------------------------------------------------------
# The faults
# ---------------------------------------------------------------------------------------------


def airflow_processes() -> dict[str, tuple[int, int]]:
    """Task instance id -> (its task runner's pid, that runner's parent: the worker supervising it)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if title.startswith("airflow worker -- "):
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                found[title.removeprefix("airflow worker -- ").strip()] = (int(proc.name), parent)
        except (OSError, ValueError, IndexError):
            continue
    return found


class Soak:
    def __init__(self, seed: int, size: Size, stack: Stack, http: httpx.Client, proxy: FaultyProxy,
                 cases: list[Case], faults: list[Fault], started: float, has_real: bool) -> None:
        self.seed, self.size, self.stack, self.http, self.proxy = seed, size, stack, http, proxy
        self.cases = {case.key: case for case in cases}
        self.faults = faults
        self.started = started
        self.has_real = has_real
        self.pending: list[threading.Thread] = []  # faults still to be undone (a stopped kubelet)
        self.windows: dict[str, int] = {}  # proxy fault mode -> how many windows of it have started

    def now(self) -> float:
        return time.monotonic() - self.started

    def log(self, message: str) -> None:
        print(f"[soak {self.now():7.1f}s] {message}", flush=True)

    def active(self) -> list[dict[str, Any]]:
        """The soak's task instances running or deferred now (REST, as a user's script would list them)."""
        found = listed(self.http, f"/api/v2/dags/{DAG_ID}/dagRuns/~/taskInstances", "task_instances",
                       {"state": ["running", "deferred"]})
        return sorted((ti for ti in found if ti["task_id"] in KINDS),
                      key=lambda ti: (ti["dag_run_id"], ti["task_id"], ti["map_index"]))

    def pick(self, fault: Fault, candidates: list[Any]) -> Any:
        return candidates[min(int(fault.pick * len(candidates)), len(candidates) - 1)] if candidates else None

    def case_of(self, ti: dict[str, Any]) -> Case:
        return self.cases[(ti["dag_run_id"], ti["task_id"], ti["map_index"])]

    def window(self, mode: str, seconds: float, start: Callable[[], None], end: Callable[[], None]) -> None:
        """A proxy fault for `seconds`; a later window of the same mode extends it instead of being cut short."""
        self.windows[mode] = self.windows.get(mode, 0) + 1
        generation = self.windows[mode]
        start()

        def ended() -> None:
            if self.windows[mode] == generation:
                end()
        threading.Timer(seconds, ended).start()

    def cluster(self, *args: str) -> str:
        done = subprocess.run([str(CLUSTER), *args], capture_output=True, text=True, timeout=300)
        return "ok" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-300:]}"

    def apply(self, fault: Fault) -> None:
        kind = fault.kind
        if kind == "kill-9 worker":
            # A task instance with a try left (a worker dying on the last one fails it with no message of
            # the provider's: Airflow's to give), and at most two kills each.
            running = [ti for ti in self.active() if ti["state"] == "running" and ti["try_number"] <= ti["max_tries"]
                       and self.case_of(ti).struck.count(fault.kind) < RETRIES - 1]
            processes = airflow_processes()
            running = [ti for ti in running if ti["id"] in processes]
            ti = self.pick(fault, running)
            if ti is None:
                fault.outcome = "no task instance was running in a worker"
                return
            runner, supervisor = processes[ti["id"]]
            for pid in (runner, supervisor):  # the worker and the task it runs, as a crashed worker goes
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            case = self.case_of(ti)
            case.struck.append(kind)
            fault.target, fault.outcome = case.name, f"killed task runner {runner} and worker {supervisor}"
        elif kind == "kill-9 triggerer":
            pid = self.stack.kill("triggerer")
            time.sleep(3)  # Compose's restart: always, after a moment
            self.stack.start("triggerer")
            fault.target, fault.outcome = "triggerer", f"killed pid {pid}, started again"
        elif kind.startswith("restart "):
            component = kind.removeprefix("restart ")
            fault.target, fault.outcome = component, self.cluster("restart", component)
        elif kind == "429 burst":
            def start() -> None:
                self.proxy.retry_after, self.proxy.every = "2", 2
            self.window("refusals", 20, start, lambda: setattr(self.proxy, "every", 0))
            fault.target, fault.outcome = "proxy", "every 2nd request refused for 20s (429 Retry-After 2, 503, 500)"
        elif kind == "5xx burst":
            def start() -> None:
                self.proxy.retry_after, self.proxy.every = "0", 3
            self.window("refusals", 20, start, lambda: setattr(self.proxy, "every", 0))
            fault.target, fault.outcome = "proxy", "every 3rd request failed for 20s (429, 503, 500)"
        elif kind == "latency":
            self.window("latency", 30, lambda: setattr(self.proxy, "latency", 1.5),
                        lambda: setattr(self.proxy, "latency", 0.0))
            fault.target, fault.outcome = "proxy", "1.5s added to every request for 30s"
        elif kind == "watch streams cut":
            before = self.proxy.streams_cut
            self.proxy.cut_streams()
            time.sleep(0.5)
            fault.target, fault.outcome = "proxy", f"{self.proxy.streams_cut - before} streams cut"
        elif kind == "expired token":
            self.window("token", 15, self.proxy.token_expired.set, self.proxy.token_expired.clear)
            fault.target, fault.outcome = "proxy", "every request's token refused (401) for 15s"
        elif kind == "lost node":
            if not self.has_real:
                fault.outcome = "no real-node training in this soak"
                return
            if any(undo.is_alive() for undo in self.pending):
                fault.outcome = "no node to lose: the real node is lost already (an earlier fault)"
                return
            fault.target = "kubelet"
            fault.outcome = self.cluster("stop", "kubelet")
            back = threading.Timer(60, lambda: self.log(f"kubelet back: {self.cluster('restart', 'kubelet')}"))
            back.start()
            self.pending.append(back)
            fault.outcome += "; back in 60s"
        elif kind in ("mark failed", "clear"):
            active = self.active()
            ti = self.pick(fault, active)
            if ti is None:
                fault.outcome = "no task instance was running or deferred"
                return
            case = self.case_of(ti)
            path = f"/api/v2/dags/{DAG_ID}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}/{ti['map_index']}"
            if kind == "mark failed":
                response = self.http.patch(path, json={"new_state": "failed"})
            else:
                response = self.http.post(f"/api/v2/dags/{DAG_ID}/clearTaskInstances", json={
                    "dry_run": False, "dag_run_id": ti["dag_run_id"], "only_failed": False, "reset_dag_runs": True,
                    "task_ids": [[ti["task_id"], ti["map_index"]]]})
            fault.target = case.name
            fault.outcome = f"{ti['state']}: HTTP {response.status_code}"
            if response.status_code == 200:
                case.actions.append(kind)
                case.struck.append(kind)
        else:
            raise ValueError(kind)

    def inject(self, stop: threading.Event) -> None:
        for fault in self.faults:
            if stop.wait(max(0.0, fault.at - self.now())):
                return
            fault.applied_at = self.now()
            try:
                self.apply(fault)
            except Exception as error:  # noqa: BLE001 (a fault that could not be applied is reported, not fatal)
                fault.outcome = f"could not apply: {error!r}"
            self.log(f"fault {fault.kind}: {fault.target or '-'}: {fault.outcome}")


# ---------------------------------------------------------------------------------------------
# The invariants, at the end
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Invariant:
    name: str
    held: int = 0
    checked: int = 0
    broken: list[str] = dataclasses.field(default_factory=list)

    def check(self, ok: bool, what: str) -> None:
        self.checked += 1
        if ok:
            self.held += 1
        else:
            self.broken.append(what)


def listed(http: httpx.Client, path: str, key: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every item of a REST list, page by page (the API serves at most [api] maximum_page_limit, 100, at once)."""
    items: list[dict[str, Any]] = []
    while True:
        response = http.get(path, params={**(params or {}), "limit": 100, "offset": len(items)})
        response.raise_for_status()
        page = response.json()[key]
        items += page
        if len(page) < 100:
            return items


def task_instances(http: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    found = listed(http, f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", "task_instances")
    return [ti for ti in found if ti["task_id"] in KINDS]


def ti_path(ti: dict[str, Any]) -> str:
    return f"/api/v2/dags/{DAG_ID}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}"


def tries(http: httpx.Client, ti: dict[str, Any]) -> list[dict[str, Any]]:
    response = http.get(f"{ti_path(ti)}/{ti['map_index']}/tries")
    response.raise_for_status()
    return response.json()["task_instances"]


def task_log(http: httpx.Client, ti: dict[str, Any], try_number: int) -> str:
    response = http.get(f"{ti_path(ti)}/logs/{try_number}", params={"map_index": ti["map_index"], "full_content": True},
                        headers={"Accept": "application/json"})
    if response.status_code != 200:
        return f"(log not readable: HTTP {response.status_code})"
    lines = []
    for part in response.json().get("content") or []:
        if not isinstance(part, dict):
            lines.append(str(part))
            continue
        lines.append(str(part.get("event", "")))
        # An exception's message is in its error_detail, not its event ("Task failed with exception").
        errors = part.get("error_detail") or []
        lines += [str(error.get("exc_value", "")) for error in errors if isinstance(error, dict)]
    return "\n".join(lines)


def seconds_between(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    return (datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(start)).total_seconds()


# What the last try's log says of a task instance a user marked failed: Airflow's words in a worker, the
# provider's on the kill (in a worker, or the trigger's when it was deferred).
# Or Airflow's refusal of the try's own report, when the mark came as the try was ending on its own.
MARKED_FAILED_SAYS = ("shouldn't be running anymore", "Task killed", "Trigger cancelled by user action",
                      "TI was not in the running state")
DEFERRED = "Pausing task as DEFERRED"


# A try a fault ended, in its own words: a Job Volcano's controller never made pods for (an apiserver restart).
FAULT_CAUSES = ("Volcano's job controller created no pod",)


def cause_named(case: Case, last_log: str, earlier_logs: list[str]) -> bool:
    """The failure's cause, as the user reads it in the task log: the user's own action (or, when the try was
    already failing on its own as the mark came, before Airflow's kill reached it, the script's exit code);
    or the exit code of the pod that failed; or, when a fault ended the last try, that fault, where an
    earlier try named the exit code."""
    exit_code = f"exit code {case.exit_code}"
    if case.actions and case.actions[-1] == "mark failed":
        # A last try whose worker was killed -9 before the mark ends mid-way (no Post Execute): no process
        # was left to hear the kill, and the task's state is the only word of it.
        died_unheard = "kill-9 worker" in case.struck and "Post Execute" not in last_log
        # A mark landing after Airflow recorded the deferral and before a triggerer took the trigger up: no
        # trigger ran (Airflow calls on_kill only of a running one), and the log ends with the deferral.
        deferred_unheard = DEFERRED in last_log and not last_log.rpartition(DEFERRED)[2].replace(
            "::endgroup::", "").strip(" .\n")
        return any(words in last_log for words in MARKED_FAILED_SAYS) or died_unheard or deferred_unheard or (
            case.outcome == "fail" and exit_code in last_log)
    if exit_code in last_log:
        return True
    return any(cause in last_log for cause in FAULT_CAUSES) and any(exit_code in log for log in earlier_logs)


def check(soak: Soak, jobs: JobWatch, core: client.CoreV1Api, custom: client.CustomObjectsApi,
          namespace: str) -> tuple[list[Invariant], dict[str, list[str]]]:
    http = soak.http
    ended = Invariant("every task instance ended in its expected state")
    causes = Invariant("every failure's message names its cause")
    results = Invariant("every success's result reached XCom once (one Job, one asset event)")
    limits = Invariant(f"no try lasted past its execution_timeout + {SLACK}s")
    single = Invariant("never two Jobs at once for one task instance (from a watch)")
    orphans = Invariant("no Volcano Job, ConfigMap or pod left that no task owns")
    notes: dict[str, list[str]] = {}

    found = {}
    for run_id in sorted({case.run_id for case in soak.cases.values()}):
        for ti in task_instances(http, run_id):
            found[(ti["dag_run_id"], ti["task_id"], ti["map_index"])] = ti
    events = listed(http, "/api/v2/assets/events", "asset_events", {"source_dag_id": DAG_ID})
    events_of: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        events_of[(event["source_run_id"], event["source_task_id"], event["source_map_index"])].append(event)
    overlapping = {ti for _, ti, _ in jobs.overlaps}
    tries_of: dict[tuple[str, str, int], dict[int, str]] = {}  # task instance -> try number -> its state

    for key, case in sorted(soak.cases.items()):
        ti = found.get(key)
        if ti is None:
            ended.check(False, f"{case.name}: no task instance")
            continue
        ended.check(ti["state"] == case.expected_state,
                    f"{case.name}: {ti['state']}, expected {case.expected_state} ({case.outcome} exit "
                    f"{case.exit_code}, deferrable={case.deferrable}, actions {case.actions})")
        all_tries = tries(http, ti)
        tries_of[key] = {one["try_number"]: one["state"] for one in all_tries}
        for one in all_tries:
            limits.check(seconds_between(one.get("start_date"), one.get("end_date")) <= EXECUTION_TIMEOUT + SLACK,
                         f"{case.name} try {one['try_number']}: "
                         f"{seconds_between(one.get('start_date'), one.get('end_date')):.0f}s")
        log = task_log(http, ti, ti["try_number"]) if ti["state"] in ("success", "failed") else ""
        if ti["state"] == "failed":
            last = ti["try_number"]
            earlier = [task_log(http, ti, one["try_number"]) for one in all_tries if one["try_number"] < last]
            causes.check(cause_named(case, log, earlier),
                         f"{case.name} (try {last}): the log's last lines:\n" + "\n".join(log.splitlines()[-15:]))
        if ti["state"] == "success":
            xcom = http.get(f"{ti_path(ti)}/xcomEntries/return_value", params={"map_index": ti["map_index"]})
            value = xcom.json().get("value") if xcom.status_code == 200 else None
            completed = {uid: job["name"] for uid, job in jobs.seen.get(key, {}).items() if job["phase"] == "Completed"}
            uids = [(e.get("extra") or {}).get("volcano_job", {}).get("uid") for e in events_of[key]]
            good = (isinstance(value, dict) and value.get("phase") == "Completed"
                    and value.get("job_name") in completed.values() and len(uids) == 1 and uids[0] in completed)
            results.check(good, f"{case.name}: XCom {str(value)[:200]}, Completed Jobs {completed}, "
                                f"asset events of Jobs {uids}")
        single.check(key not in overlapping, f"{case.name}: " + "; ".join(
            f"at {at:.0f}s: {names}" for at, ti_key, names in jobs.overlaps if ti_key == key))
        if ti["state"] != case.expected_state or key in overlapping:
            notes[case.name] = [f"state {ti['state']} try {ti['try_number']}", f"struck by {case.struck}",
                                f"Jobs seen {jobs.seen.get(key)}", *log.splitlines()[-25:]]

    # What is left, once Kubernetes' garbage collector has had its time.
    time.sleep(20)
    left = custom.list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", namespace, "jobs")["items"]
    left_uids = {job["metadata"]["uid"] for job in left}
    per_try: Counter = Counter((identity(job), try_label(job)) for job in left)
    for job in left:
        ti_key, try_number = identity(job), try_label(job)
        ti = found.get(ti_key) if ti_key else None
        phase = ((job.get("status") or {}).get("state") or {}).get("phase", "")
        # A failed Job is kept for its logs (on_finish_action delete_succeeded_job): the try it failed owns it;
        # or, when Airflow ended that try before it reported the Job, the later try that reattached and
        # reported it (labelled checked).
        try_state = tries_of.get(ti_key, {}).get(try_number) if ti_key else None
        reported = (job["metadata"].get("labels") or {}).get(LABEL_PREFIX + "checked") == "true"
        owned = (ti is not None and phase in FAILED_PHASES and (try_state in ("failed", "up_for_retry") or reported)
                 and per_try[(ti_key, try_number)] == 1)
        # Or an orphan a sweep found (a task instance ended with no process of it left): marked, and deleted by
        # the first submission in the namespace ORPHAN_GRACE after the mark (docs/deferrable.md "Orphaned Jobs").
        marked = LABEL_PREFIX + "orphaned-at" in (job["metadata"].get("annotations") or {})
        owned = owned or (marked and ti is not None and ti["state"] in ("failed", "success"))
        orphans.check(owned, f"Job {job['metadata']['name']} ({phase}) of {ti_key} try {try_number}: task instance "
                              f"{ti['state'] if ti else 'unknown'}, that try {try_state}")
    for configmap in core.list_namespaced_config_map(namespace).items:
        if configmap.metadata.name == "kube-root-ca.crt":
            continue
        owners = {ref.uid for ref in configmap.metadata.owner_references or []}
        orphans.check(bool(owners & left_uids), f"ConfigMap {configmap.metadata.name} owned by no Job left")
    for pod in core.list_namespaced_pod(namespace).items:
        owners = {ref.uid for ref in pod.metadata.owner_references or []}
        orphans.check(bool(owners & left_uids), f"pod {pod.metadata.name} owned by no Job left")
    if not left:
        orphans.check(True, "")
    return [ended, causes, results, limits, single, orphans], notes


# ---------------------------------------------------------------------------------------------
# Setting up: the namespace, the identity, the proxy, the Airflow services
# ---------------------------------------------------------------------------------------------


def cluster_kubeconfig() -> Path:
    done = subprocess.run([str(CLUSTER), "up"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the local cluster does not start:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclasses.dataclass
class Namespace:
    name: str
    token: str


def make_namespace(admin: client.ApiClient, name: str, hours: float) -> Namespace:
    core = client.CoreV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    utils.create_from_yaml(admin, str(REPO / "deploy" / "rbac.yaml"), namespace=name)
    grant_queue_reader(admin, name)
    token = core.create_namespaced_service_account_token("airflow-volcano", name, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=int(hours * 3600)))).status.token
    return Namespace(name, token)


def proxied_kubeconfig(path: Path, proxy: FaultyProxy, namespace: Namespace) -> None:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "soak",
        "clusters": [{"name": "soak", "cluster": {"server": proxy.url}}],
        "users": [{"name": "soak", "user": {"token": namespace.token}}],
        "contexts": [{"name": "soak", "context": {"cluster": "soak", "user": "soak", "namespace": namespace.name}}],
    }))
    path.chmod(0o600)


def real_node_placement() -> dict[str, Any]:
    return json.loads(subprocess.run([str(CLUSTER), "real-node"], capture_output=True, text=True, check=True).stdout)


def runs_state(http: httpx.Client, run_ids: list[str]) -> dict[str, str]:
    try:
        runs = listed(http, f"/api/v2/dags/{DAG_ID}/dagRuns", "dag_runs")
    except httpx.HTTPError:  # the api-server busy: asked again at the next look
        return {}
    return {run["dag_run_id"]: run["state"] for run in runs if run["dag_run_id"] in run_ids}


def report(seed: int, size_name: str, cases: list[Case], faults: list[Fault], invariants: list[Invariant],
           notes: dict[str, list[str]], jobs: JobWatch, wall: float, path: Path) -> bool:
    states = Counter(case.expected_state for case in cases)
    applied = Counter(fault.kind for fault in faults if fault.applied_at and not fault.outcome.startswith(
        ("no ", "could not")))
    skipped = Counter(fault.kind for fault in faults if fault.outcome.startswith(("no ", "could not")))
    print(f"\nChaos soak, seed {seed}, size {size_name}: {len(cases)} task instances in {wall / 60:.1f} min "
          f"({sum(c.deferrable for c in cases)} deferred, {dict(Counter(c.kind for c in cases))}); "
          f"expected {dict(states)}")
    print(f"faults injected: {sum(applied.values())} ({', '.join(f'{k} {v}' for k, v in sorted(applied.items()))})")
    if skipped:
        print(f"faults with no target when due: {dict(skipped)}")
    print(f"the Job watch lost etcd's history and was relisted {jobs.breaks} time(s)\n")
    print(f"{'invariant':78} held")
    for invariant in invariants:
        share = 100.0 * invariant.held / invariant.checked if invariant.checked else 100.0
        # Rounded down: 673 of 674 is not 100 %.
        print(f"{invariant.name:78} {invariant.held}/{invariant.checked} ({int(share * 10) / 10:g}%)")
    for invariant in invariants:
        for what in invariant.broken[:10]:
            print(f"\nBROKEN: {invariant.name}: {what}")
            name = what.split(":", 1)[0].split(" try ")[0]
            case = next((c for c in cases if c.name == name), None)
            if case is not None:
                print("  faults struck it: " + ", ".join(case.struck or ["none"]))
                near = [f for f in faults if f.applied_at and f.target in (name, "proxy", "triggerer", "kubelet")
                        or f.kind.startswith("restart ")]
                print("  faults of the soak, for its time: " + "; ".join(
                    f"{f.applied_at:.0f}s {f.kind} {f.target}" for f in near if f.applied_at))
            for line in notes.get(name, []):
                print(f"  | {line}")
        if len(invariant.broken) > 10:
            print(f"\n... and {len(invariant.broken) - 10} more breaks of {invariant.name!r} (in the report)")
    path.write_text(json.dumps({
        "seed": seed, "size": size_name, "wall_seconds": round(wall), "task_instances": len(cases),
        "faults": [dataclasses.asdict(fault) for fault in faults],
        "cases": [dataclasses.asdict(case) for case in cases],
        "invariants": [{"name": i.name, "held": i.held, "checked": i.checked, "broken": i.broken} for i in invariants],
        "overlaps": [[at, list(ti), names] for at, ti, names in jobs.overlaps],
    }, indent=1))
    print(f"\nreport: {path}\nreplay: .venv/bin/python benchmarks/chaos_soak.py --size {size_name} --seed {seed}")
    return all(invariant.held == invariant.checked for invariant in invariants)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--seed", type=int, default=None, help="replay this seed (default: a new one)")
    parser.add_argument("--keep", action="store_true", help="keep the namespace (its Jobs, pods and events)")
    args = parser.parse_args(argv)
    # A SIGTERM (a timeout, Ctrl-C's cousin) stops the services and deletes the namespace as the end would.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    size = SIZES[args.size]
    print(f"chaos soak: seed {seed}, size {args.size}", flush=True)
    cases, faults = plan(seed, size)

    kubeconfig = cluster_kubeconfig()
    admin = config.new_client_from_config(str(kubeconfig))
    work = ARTIFACTS / f"{args.size}-{seed}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "airflow-home" / "dags").mkdir(parents=True)
    namespace = make_namespace(admin, f"soak-{seed}-{os.urandom(2).hex()}", hours=3)
    upstream = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    has_real = any(case.kind == "real" for case in cases)
    exit_code = 1
    try:
        with FaultyProxy(upstream, kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
            proxied = work / "kubeconfig.json"
            proxied_kubeconfig(proxied, proxy, namespace)
            dags = work / "airflow-home" / "dags"
            for source in ("chaos_soak_dag.py", "soak_train.py"):
                shutil.copy(REPO / "benchmarks" / source, dags / source)
            (dags / "soak-settings.json").write_text(json.dumps({
                "namespace": namespace.name, "max_active_runs": 4, "retries": RETRIES, "retry_delay": RETRY_DELAY,
                "execution_timeout": EXECUTION_TIMEOUT, "startup_timeout": STARTUP_TIMEOUT,
                "real_node": real_node_placement()}))
            extra_env = {
                "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps({"conn_type": "kubernetes", "extra": {
                    "kube_config_path": str(proxied), "namespace": namespace.name}}),
                "AIRFLOW__CORE__PARALLELISM": "12",
                "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "48",
                # A dead worker's task instance is failed (and retried) after this long without a heartbeat.
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "10",
            }
            with compose_stack(kubeconfig, work / "airflow-home", extra_env=extra_env) as stack:
                username, password = login(stack)
                with signed_in(stack, username, password) as http:
                    exit_code = soak(seed, args.size, size, cases, faults, stack, http, proxy, admin, namespace.name,
                                     has_real, work)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        exit_code = 1
    finally:
        subprocess.run([str(CLUSTER), "up"], capture_output=True)  # a component a fault left stopped comes back
        if args.keep:
            print(f"kept namespace {namespace.name}")
        else:
            revoke_queue_reader(admin, namespace.name)
            client.CoreV1Api(admin).delete_namespace(namespace.name)
    return exit_code


def soak(seed: int, size_name: str, size: Size, cases: list[Case], faults: list[Fault], stack: Stack,
         http: httpx.Client, proxy: FaultyProxy, admin: client.ApiClient, namespace: str, has_real: bool,
         work: Path) -> int:
    unpause(http, DAG_ID)
    started = time.monotonic()
    soak = Soak(seed, size, stack, http, proxy, cases, faults, started, has_real)
    run_ids = sorted({case.run_id for case in cases})
    stop = threading.Event()
    with JobWatch(namespace, soak.now) as jobs:
        injector = threading.Thread(target=soak.inject, args=(stop,), daemon=True)
        injector.start()
        for number, run_id in enumerate(run_ids):
            time.sleep(max(0.0, number * size.run_interval - soak.now()))
            conf = {"cases": {kind: [case.kwargs() for case in cases if case.run_id == run_id and case.kind == kind]
                              for kind in KINDS}}
            response = http.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"dag_run_id": run_id, "logical_date": None,
                                                                         "conf": conf})
            soak.log(f"triggered {run_id}: HTTP {response.status_code}")
        deadline = soak.now() + size.deadline
        while soak.now() < deadline:
            states = runs_state(http, run_ids)
            if len(states) == len(run_ids) and all(state in ("success", "failed") for state in states.values()):
                break
            if int(soak.now()) % 60 < 5:
                soak.log(f"runs: {dict(Counter(states.values()))}")
            time.sleep(5)
        else:
            soak.log(f"runs not ended by the deadline: {runs_state(http, run_ids)}")
        stop.set()
        injector.join(timeout=120)
        for undo in soak.pending:  # a lost node's kubelet comes back
            undo.join()
        invariants, notes = check(soak, jobs, client.CoreV1Api(admin), client.CustomObjectsApi(admin), namespace)
    wall = time.monotonic() - started
    held = report(seed, size_name, cases, faults, invariants, notes, jobs, wall, work / "report.json")
    shutil.copy(work / "report.json", ARTIFACTS / f"report-{size_name}-{seed}.json")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
