"""Where `make test`'s CPU goes: samples every process of this machine while the suite runs and charges its
CPU time to a test or to a component of the cluster.

    .venv/bin/python benchmarks/suite_cpu.py -- scripts/test-suite        the whole suite, then the report
    .venv/bin/python benchmarks/suite_cpu.py --report .artifacts/suite-cpu.json     a report again

A process is charged by what it is, in this order: a pod's (its cgroup names the pod's uid; the pod's
namespace, the namespace's `airflow-volcano.io/test` annotation, which tests/integration/conftest.py writes,
the test), a test's own subprocess (PYTEST_CURRENT_TEST in the environment it was started with: an
Airflow worker, triggerer, API server; for a worker forked warm, the test its zygote recorded), or by
its command (kube-apiserver, etcd, the pytest workers
themselves, which set that variable only after they started). Processes are read every 2 s: one that
starts and ends between two reads is not seen, so the charged total is below the machine's, which the
report gives too (from /proc/stat). The suite's figures are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from kubernetes import client, config

REPO = Path(__file__).resolve().parent.parent
KUBECONFIG = "/tmp/airflow-volcano-cluster/kubeconfig"
# Each warm worker's test, by pid (tests/integration/warm_worker.py writes them).
WARM_WORKERS = Path("/tmp/airflow-volcano-warm-workers")
TEST_ANNOTATION = "airflow-volcano.io/test"
INTERVAL = 2.0
TICKS = os.sysconf("SC_CLK_TCK")
POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def busy_seconds() -> float:
    """The machine's CPU seconds not idle nor waiting for I/O, since boot."""
    values = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICKS


def process_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def program(pid: int) -> str:
    """The command, short: its first words without directories."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]
    except OSError:
        return "?"
    return " ".join(word.decode(errors="replace").rsplit("/", 1)[-1] for word in words if word)[:60]


class Sampler:
    def __init__(self) -> None:
        self.core: client.CoreV1Api | None = None  # once the suite has started the cluster
        self.pods: dict[str, str] = {}  # uid -> namespace
        self.tests: dict[str, str] = {}  # namespace -> test
        self.charged: Counter[str] = Counter()
        self.last: dict[int, tuple[float, str]] = {}
        self.stopped = threading.Event()

    def refresh(self) -> None:
        try:
            if self.core is None:
                if not Path(os.environ.get("KUBECONFIG", KUBECONFIG)).exists():
                    return
                self.core = client.CoreV1Api(config.new_client_from_config(os.environ.get("KUBECONFIG", KUBECONFIG)))
            for namespace in self.core.list_namespace().items:
                test = (namespace.metadata.annotations or {}).get(TEST_ANNOTATION)
                if test:
                    self.tests[namespace.metadata.name] = test
            for pod in self.core.list_pod_for_all_namespaces().items:
                self.pods[pod.metadata.uid] = pod.metadata.namespace
        except Exception as error:  # noqa: BLE001 - the cluster restarting under a disruptive test
            print(f"suite_cpu: {error}", file=sys.stderr)

    def owner(self, pid: int) -> str | None:
        try:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        if match := POD_UID.search(cgroup):
            namespace = self.pods.get(match.group(1).replace("_", "-"))
            if namespace is None:
                return "pod (not yet known)"
            return f"{self.tests.get(namespace, namespace)} :: pod"
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            # A worker forked warm (tests/integration/warm_worker.py) has its zygote's environment there.
            forked_for = (WARM_WORKERS / str(pid)).read_bytes() if (WARM_WORKERS / str(pid)).exists() else b""
        except OSError:
            return None
        if forked_for:
            environment = [b"PYTEST_CURRENT_TEST=" + forked_for]
        for variable in environment:
            if variable.startswith(b"PYTEST_CURRENT_TEST="):
                test = variable.split(b"=", 1)[1].decode(errors="replace").rsplit(" ", 1)[0]
                return f"{test} :: {program(pid)}"
        return f"(machine) {program(pid)}"

    def sample(self, first: bool) -> None:
        alive = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            seconds = process_seconds(pid)
            if seconds is None:
                continue
            alive.add(pid)
            before = self.last.get(pid)
            owner = before[1] if before and not before[1].startswith("pod (not") else self.owner(pid)
            if owner is None:
                continue
            self.charged[owner] += 0.0 if first else max(seconds - (before[0] if before else 0.0), 0.0)
            self.last[pid] = (seconds, owner)
        for pid in set(self.last) - alive:
            del self.last[pid]

    def run(self) -> None:
        tick = 0
        while not self.stopped.is_set():
            if tick % 3 == 0:
                self.refresh()
            self.sample(first=tick == 0)
            tick += 1
            self.stopped.wait(INTERVAL)


def report(result: dict, top: int) -> None:
    by_test: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    for owner, seconds in result["charged"].items():
        if owner.startswith("(machine) ") or owner.startswith("pod (not"):
            by_kind[owner] += seconds
            continue
        test, what = owner.split(" :: ", 1)
        by_test[test] += seconds
        by_kind["tests' pods" if what == "pod" else "tests' " + " ".join(what.split()[:2])] += seconds
    charged = sum(result["charged"].values())
    print(f"{result['wall_seconds'] / 60:.1f} min, the machine busy {result['busy_seconds']:.0f} CPU-s "
          f"({result['busy_seconds'] / result['wall_seconds']:.2f} cores on average); charged {charged:.0f} CPU-s")
    print(f"\nby kind (top {top}):")
    for kind, seconds in by_kind.most_common(top):
        print(f"  {seconds:7.0f}  {kind}")
    print(f"\nby test (top {top}):")
    for test, seconds in by_test.most_common(top):
        print(f"  {seconds:7.0f}  {test}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / ".artifacts" / "suite-cpu.json")
    parser.add_argument("--report", type=Path, help="print the report of an earlier run and exit")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("command", nargs="*", help="what to run and measure, after --")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()), args.top)
        return 0
    if not args.command:
        parser.error("give the command to measure after --, e.g. -- scripts/test-suite")
    sampler = Sampler()
    thread = threading.Thread(target=sampler.run, daemon=True)
    started, busy = time.monotonic(), busy_seconds()
    thread.start()
    suite = subprocess.Popen(args.command, cwd=REPO)
    try:
        code = suite.wait()
    except KeyboardInterrupt:
        suite.send_signal(signal.SIGINT)
        code = suite.wait()
    sampler.stopped.set()
    thread.join()
    result = {"command": args.command, "exit_code": code, "wall_seconds": time.monotonic() - started,
              "busy_seconds": busy_seconds() - busy,
              "charged": dict(sorted(sampler.charged.items(), key=lambda item: -item[1]))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=0))
    report(result, args.top)
    return code


if __name__ == "__main__":
    sys.exit(main())
