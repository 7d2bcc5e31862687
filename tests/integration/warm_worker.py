"""Airflow workers started warm: dag_runner.py processes forked from one that has imported Airflow.

A test that kills a worker needs the worker as a process of its own (dag_runner.py). Started anew, each
imports Airflow, the provider and the in-process execution API and builds that API's app first: most
of what such a process spends on a one-task DAG (benchmarks/worker_start.py; docs/performance.md). A
warm worker instead is forked from a zygote: a process of the same interpreter and environment that has
done those imports and built that app once and then only forks. Its children are real processes: their
own pid, which the test signals (SIGTERM, SIGKILL) as any worker, their exit status reported as
`subprocess.Popen` reports it.

`start(argv, env, log, python)` returns a `WarmProcess` (Popen's `pid`, `returncode`, `poll`, `wait`,
`send_signal`, `terminate`, `kill`). A zygote per interpreter and environment, in each pytest worker: a
variable read only when the task runs (a connection, a variable, the current test's name) may differ
between its children; a worker whose environment differs in any other (AIRFLOW_HOME, PYTHONPATH, an
AIRFLOW__ setting), or of another Airflow release's interpreter, is forked from a zygote of its own.

As a script (`python warm_worker.py`) it is the zygote: it answers `ready`, then for each request line
(JSON: argv, env, log) forks a child that runs dag_runner.py with that argv and environment, its output
appended to `log`, and answers `pid N`; when a child ends it says `exit N RETURNCODE`. It ends at the end
of its input (the test process gone).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

RUNNER = Path(__file__).with_name("dag_runner.py")
# Each running child's test (its PYTEST_CURRENT_TEST), by pid: a forked child keeps the environment the
# zygote was started with in /proc/PID/environ, so benchmarks/suite_cpu.py charges it from here.
OWNERS = Path("/tmp/airflow-volcano-warm-workers")
# Read by Airflow or the provider only when a task runs, never at import: they may differ per child.
PER_CHILD = ("AIRFLOW_CONN_", "AIRFLOW_VAR_", "PYTEST_CURRENT_TEST")


def import_what_a_worker_imports() -> None:
    """What dag_runner.py imports before its task starts (Airflow, its task runner and in-process
    execution API), and every module of the provider: a task imports its hooks, wait engine and
    Kubernetes clients only as it runs (nothing heavy at DAG parse), which each child then did again
    (a fifth of what the children spent, py-spy, 2026-12-07). Not the pods' own modules
    (`airflow_volcano.shell`: stack_dumps.py is a container's sitecustomize and acts on import), nor one
    needing an optional package this interpreter lacks (OpenLineage), which a task would not import
    either. Importing connects to nothing and starts no thread."""
    import importlib
    import pkgutil

    import airflow.api_fastapi.execution_api.app  # noqa: F401
    import airflow.api_fastapi.execution_api.routes  # noqa: F401
    import airflow.dag_processing.collection  # noqa: F401
    import airflow.sdk  # noqa: F401
    import airflow.sdk.execution_time.supervisor  # noqa: F401
    import airflow.sdk.execution_time.task_runner  # noqa: F401

    import airflow_volcano

    for module in pkgutil.walk_packages(airflow_volcano.__path__, "airflow_volcano."):
        if module.name.startswith("airflow_volcano.shell."):
            continue
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as missing:
            if (missing.name or "").startswith("airflow_volcano"):
                raise


def build_the_in_process_execution_api() -> None:
    """The app of the in-process execution API, which dag.test() builds at its first request, built
    here once: its versioned routes (Cadwyn makes them at the app's first call) were 62 % of what a
    forked child spent (py-spy, 2026-11-29). Building it reads the configuration and connects to
    nothing; its transport (a thread and an event loop) is left for each child to start.

    dag.test() asks `in_process_api_server()` for a new one, so the children are given this one: in
    Airflow 3.3 every new one shares one app, but 3.1's and 3.2's each build and initialize an app of
    their own (about 2 CPU-s, a third of what those children spent, py-spy, 2026-12-07)."""
    from airflow.sdk.execution_time import supervisor

    api = supervisor.in_process_api_server()
    app = api.app
    if not getattr(app, "_cadwyn_initialized", True):
        app._cadwyn_initialize()
    supervisor.in_process_api_server = lambda: api


def run_child(request: dict, answers: int) -> None:
    """In the forked child: become the requested dag_runner.py process, then exit with its code. The
    zygote's answers are not its to write (`answers`, closed)."""
    code = 1
    try:
        os.close(answers)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [str(RUNNER), *request["argv"]]
        sys.path[0] = str(RUNNER.parent)
        import runpy

        runpy.run_path(str(RUNNER), run_name="__main__")
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:  # noqa: BLE001 - what a worker's traceback would say, then its exit code
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def zygote() -> int:
    # Its answers go on a descriptor of their own: what an Airflow prints on its import (3.2 logs to
    # stdout) goes to stderr. A child closes it (run_child), so the pipe ends with the zygote.
    answer = os.fdopen(os.dup(1), "w")
    os.set_inheritable(answer.fileno(), False)
    os.dup2(2, 1)
    import_what_a_worker_imports()
    build_the_in_process_execution_api()
    if threading.active_count() != 1:  # a fork copies no thread: the children would miss one
        answer.write(f"not forkable: {threading.active_count()} threads after the imports\n")
        answer.flush()
        return 1
    OWNERS.mkdir(exist_ok=True)
    answer.write("ready\n")
    answer.flush()
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    children: set[int] = set()
    while True:
        for _ in selector.select(timeout=0.2):
            line = sys.stdin.readline()
            if not line:
                return 0
            request = json.loads(line)
            answer.flush()
            pid = os.fork()
            if pid == 0:
                run_child(request, answer.fileno())
            children.add(pid)
            (OWNERS / str(pid)).write_text(request["env"].get("PYTEST_CURRENT_TEST", ""))
            answer.write(f"pid {pid}\n")
            answer.flush()
        for pid in list(children):
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                children.discard(pid)
                (OWNERS / str(pid)).unlink(missing_ok=True)
                answer.write(f"exit {pid} {os.waitstatus_to_exitcode(status)}\n")
                answer.flush()


def start_time(environment: dict[str, str]) -> dict[str, str]:
    """What of an environment the interpreter, Airflow or the provider may read before a task runs."""
    return {name: value for name, value in environment.items()
            if not name.startswith(PER_CHILD) and name != "PYTHONUNBUFFERED"}


class Zygote:
    """The test process's end of one zygote."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        OWNERS.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=OWNERS, prefix="zygote-", suffix=".log", delete=False) as errors:
            self.errors = Path(errors.name)  # what it says on stderr, kept for a start that fails
            self.process = subprocess.Popen([python, str(Path(__file__).resolve())], env=env, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=errors, text=True)
        assert self.process.stdout is not None
        first = self.process.stdout.readline().strip()
        if first != "ready":
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"the warm worker of {python} did not start: {first or 'no answer'}\n"
                               f"{self.errors.read_text()[-3000:]}")
        self.errors.unlink()  # needed only for a start that fails
        self.lock = threading.Lock()
        self.changed = threading.Condition()
        self.started: list[int] = []
        self.forked: list[int] = []
        self.ended: dict[int, int] = {}
        threading.Thread(target=self.read, daemon=True).start()

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            kind, pid, *rest = line.split()
            with self.changed:
                if kind == "pid":
                    self.started.append(int(pid))
                else:
                    self.ended[int(pid)] = int(rest[0])
                self.changed.notify_all()

    def fork(self, argv: list[str], env: dict[str, str], log: Path) -> int:
        assert self.process.stdin is not None
        with self.lock:
            with self.changed:
                self.started.clear()
            self.process.stdin.write(json.dumps({"argv": argv, "env": env, "log": str(log)}) + "\n")
            self.process.stdin.flush()
            with self.changed:
                if not self.changed.wait_for(lambda: self.started, timeout=60):
                    raise RuntimeError("the warm worker did not fork")
                pid = self.started.pop()
                self.forked.append(pid)
                return pid

    def idle(self) -> bool:
        """No child of it is still running."""
        with self.changed:
            return set(self.forked) <= set(self.ended)

    def close(self) -> None:
        """The end of its input: the zygote ends (its running children go on); wait for it."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


class WarmProcess:
    """A forked worker, as subprocess.Popen presents a process."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with self.zygote.changed:
            self.returncode = self.zygote.ended.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.zygote.changed:
            if not self.zygote.changed.wait_for(lambda: self.pid in self.zygote.ended, timeout=timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = self.zygote.ended[self.pid]
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


# The zygotes of this pytest worker, by interpreter and start-time environment, the last used last. A
# zygote holds about 200 MB: beyond the KEPT last used, one whose children have all ended is closed.
_ZYGOTES: dict[tuple[str, tuple[tuple[str, str], ...]], Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()
KEPT = 3


def start(argv: list[str], env: dict[str, str], log: Path,
          python: str | Path = sys.executable) -> WarmProcess:
    """dag_runner.py with `argv` under `python` (another Airflow release's venv, say), its output appended
    to `log` (created before this returns): forked from this pytest worker's zygote of that interpreter
    and that environment but for what each child may set (PER_CHILD), started on first use and kept
    while it is among the KEPT last used (the suite's own environment, a test's Airflow home)."""
    log.open("ab").close()
    key = (str(python), tuple(sorted(start_time(env).items())))
    with _ZYGOTES_LOCK:
        zygote = _ZYGOTES.pop(key, None)
        if zygote is None or zygote.process.poll() is not None:
            for old_key in list(_ZYGOTES)[:max(0, len(_ZYGOTES) - (KEPT - 1))]:
                if _ZYGOTES[old_key].idle():
                    _ZYGOTES.pop(old_key).close()
            zygote = Zygote(str(python), {**env, "PYTHONUNBUFFERED": "1"})
        _ZYGOTES[key] = zygote
    return WarmProcess(zygote, zygote.fork(argv, env, log), [str(RUNNER), *argv])


if __name__ == "__main__":
    sys.exit(zygote())
