"""Where `make test`'s CPU goes: samples every process of this machine while the suite runs and charges its
CPU time to a test or to a component of the cluster.

    .venv/bin/python benchmarks/suite_cpu.py -- scripts/test-suite        the whole suite, then the report
    .venv/bin/python benchmarks/suite_cpu.py --report .artifacts/suite-cpu.json     a report again
    .venv/bin/python benchmarks/suite_cpu.py --report .artifacts/suite-cpu.json \
        --timeline .artifacts/test-suite/timeline      and the tests running in each minute

A process is charged by what it is, in this order: a pod's (its cgroup names the pod's uid; the pod's
namespace, the namespace's `airflow-volcano.io/test` annotation, which tests/integration/conftest.py writes,
the test), a test's own subprocess (PYTEST_CURRENT_TEST in the environment it was started with: an
Airflow worker, triggerer, API server; for a worker forked warm, the test its zygote recorded), or by
its command (kube-apiserver, etcd, the pytest workers
themselves, which set that variable only after they started). Processes are read every 2 s; what a
process spent after its last read, or all of it when it started and ended between two reads (a kubectl, a
runc, a CNI plugin), comes from the kernel's process accounting (acct(2): a record of each process as it
exits), charged to the process's owner if it was seen, else to its parent's. The report gives the
machine's busy total too (from /proc/stat), and its busy cores minute by minute: where the suite leaves the
CPU idle, waiting on time rather than work. The suite's figures are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from kubernetes import client, config

REPO = Path(__file__).resolve().parent.parent
KUBECONFIG = "/tmp/airflow-volcano-cluster/kubeconfig"
# Each warm worker's test, by pid (tests/integration/warm_worker.py writes them).
WARM_WORKERS = Path("/tmp/airflow-volcano-warm-workers")
TEST_ANNOTATION = "airflow-volcano.io/test"
INTERVAL = 2.0
# How often, in reads, the machine's speed is measured (fixed_work_seconds).
SPEED_EVERY = 15
TICKS = os.sysconf("SC_CLK_TCK")
# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime, then
# utime, stime and six more as comp_t (13-bit mantissa, 3-bit base-8 exponent, in AHZ = 100 ticks a second),
# then the command's first 16 bytes.
ACCT_RECORD = struct.Struct("<BBHIIIIIIf8H16s")
ACCT_HZ = 100
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


def comp_t(value: int) -> int:
    return (value & 0x1FFF) << (3 * (value >> 13))


class ProcessAccounting:
    """The kernel's BSD process accounting, on while the suite runs: a record of each process as it exits
    (pid, parent pid, CPU time, command), read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.libc = ctypes.CDLL(None, use_errno=True)

    def start(self) -> None:
        self.path.write_bytes(b"")
        if self.libc.acct(str(self.path).encode()) != 0:
            raise OSError(ctypes.get_errno(), f"acct({self.path}): process accounting needs root")

    def stop(self) -> None:
        self.libc.acct(None)

    def exited(self) -> list[tuple[int, int, float, str]]:
        """(pid, parent pid, CPU seconds, command) of each process that exited since the last call."""
        with self.path.open("rb") as records:
            records.seek(self.offset)
            data = records.read()
        whole = len(data) - len(data) % ACCT_RECORD.size
        self.offset += whole
        exited = []
        for start in range(0, whole, ACCT_RECORD.size):
            record = ACCT_RECORD.unpack_from(data, start)
            pid, ppid, utime, stime, command = record[6], record[7], record[10], record[11], record[-1]
            exited.append((pid, ppid, (comp_t(utime) + comp_t(stime)) / ACCT_HZ,
                           command.rstrip(b"\0").decode(errors="replace")))
        return exited


class Sampler:
    def __init__(self, accounting: ProcessAccounting) -> None:
        self.accounting = accounting
        self.core: client.CoreV1Api | None = None  # once the suite has started the cluster
        self.pods: dict[str, str] = {}  # uid -> namespace
        self.tests: dict[str, str] = {}  # namespace -> test
        self.charged: defaultdict[str, float] = defaultdict(float)
        self.last: dict[int, tuple[float, str]] = {}
        self.stopped = threading.Event()
        self.busy: list[tuple[float, float]] = []  # (monotonic seconds, the machine's busy CPU-s) each read
        self.speed: list[float] = []  # fixed_work_seconds(), every SPEED_EVERY reads

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

    def charge_exited(self) -> None:
        """What each process that exited since the last read spent after it (all of it, if never read)."""
        for pid, ppid, seconds, command in self.accounting.exited():
            seen = self.last.pop(pid, None)
            if seen is not None:
                self.charged[seen[1]] += max(seconds - seen[0], 0.0)
                continue
            parent = self.last.get(ppid)
            if parent is None:
                self.charged[f"(machine) {command} (exited unseen, parent unknown)"] += seconds
            elif " :: " in parent[1]:
                self.charged[f"{parent[1].split(' :: ', 1)[0]} :: {command} (exited unseen)"] += seconds
            else:
                self.charged[f"{parent[1]} > {command}"] += seconds

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
            if tick:
                self.charge_exited()
            self.sample(first=tick == 0)
            self.busy.append((time.monotonic(), busy_seconds()))
            if tick % SPEED_EVERY == 0:
                self.speed.append(fixed_work_seconds())
            tick += 1
            self.stopped.wait(INTERVAL)


def cores_by_minute(busy: list[tuple[float, float]], started: float) -> list[float]:
    """The machine's average busy cores in each minute since `started`, from the busy reads: where the
    suite leaves the CPU idle (waiting on time, not on work)."""
    spent: list[float] = []
    spans: list[float] = []  # the seconds of each minute read (the last one's are fewer)
    for (at, before), (later, after) in zip(busy, busy[1:], strict=False):
        minute = int((at - started) // 60)
        for kept in (spent, spans):
            kept.extend([0.0] * (minute + 1 - len(kept)))
        spent[minute] += after - before
        spans[minute] += later - at
    return [round(seconds / span, 2) if span else 0.0 for seconds, span in zip(spent, spans, strict=True)]


def tests_by_minute(timeline: Path, started: float, minutes: int) -> list[list[str]]:
    """The tests running in each minute since `started` (wall-clock seconds), from the timeline each
    pytest process writes when TEST_TIMELINE names a directory (tests/conftest.py; scripts/test-suite sets
    it): which tests the machine was waiting on where it idled."""
    running: list[list[str]] = [[] for _ in range(minutes)]
    for path in sorted(timeline.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            # The unit tests take seconds each: one entry a minute for all of them, not named.
            unit = "/unit/" in f"/{record['test']}"
            name = "(unit tests)" if unit else record["test"].split("::", 1)[-1]
            first, last = (int((record[edge] - started) // 60) for edge in ("start", "end"))
            for minute in range(max(first, 0), min(last, minutes - 1) + 1):
                if not (unit and name in running[minute]):
                    running[minute].append(name)
    return running


def fixed_work_seconds() -> float:
    """The CPU seconds this thread spends on one fixed piece of work: what the machine's CPU time is worth.
    It varies here, from second to second and from run to run (2026-12-07: two runs of one suite were
    busy 3,018 then 3,683 CPU-s, and pip's compileall of the same venvs in them took 46 then 62): compare
    runs' CPU-s and minutes only at like figures. The thread's own CPU time, not the wall's: cores taken
    by the suite do not count, only how fast a core works."""
    started = time.thread_time()
    sum(number * number for number in range(1_000_000))
    return time.thread_time() - started


def report(result: dict, top: int, timeline: Path | None = None) -> None:
    by_test: defaultdict[str, float] = defaultdict(float)
    by_kind: defaultdict[str, float] = defaultdict(float)
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
    if speed := sorted(result.get("fixed_work_seconds") or []):
        print(f"the machine's speed: a fixed piece of work took {statistics.median(speed):.3f} CPU-s "
              f"(the median of {len(speed)}, every {SPEED_EVERY * INTERVAL:.0f} s; the middle half "
              f"{speed[len(speed) // 4]:.3f} to {speed[3 * len(speed) // 4]:.3f}; lower is faster)")
    if by_minute := result.get("cores_by_minute"):
        print(f"busy cores, minute by minute (of {os.cpu_count()}):")
        for first in range(0, len(by_minute), 10):
            print(f"  {first:3d}: " + " ".join(f"{cores:4.2f}" for cores in by_minute[first:first + 10]))
        if timeline and "started_at" in result:
            print("\nthe tests running, minute by minute:")
            running = tests_by_minute(timeline, result["started_at"], len(by_minute))
            for minute, (cores, names) in enumerate(zip(by_minute, running, strict=True)):
                print(f"  {minute:3d} {cores:4.2f} {len(names):2d}: {', '.join(name[:60] for name in names)}")
    print(f"\nby kind (top {top}):")
    for kind, seconds in sorted(by_kind.items(), key=lambda item: -item[1])[:top]:
        print(f"  {seconds:7.0f}  {kind}")
    print(f"\nby test (top {top}):")
    for test, seconds in sorted(by_test.items(), key=lambda item: -item[1])[:top]:
        print(f"  {seconds:7.0f}  {test}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / ".artifacts" / "suite-cpu.json")
    parser.add_argument("--report", type=Path, help="print the report of an earlier run and exit")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--timeline", type=Path, help="with --report: the tests' timeline directory "
                        "(scripts/test-suite's .artifacts/test-suite/timeline) to list the tests of each minute")
    parser.add_argument("command", nargs="*", help="what to run and measure, after --")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()), args.top, args.timeline)
        return 0
    if not args.command:
        parser.error("give the command to measure after --, e.g. -- scripts/test-suite")
    accounting = ProcessAccounting(args.out.with_suffix(".acct"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    accounting.start()
    sampler = Sampler(accounting)
    thread = threading.Thread(target=sampler.run, daemon=True)
    started, started_at, busy = time.monotonic(), time.time(), busy_seconds()
    thread.start()
    suite = subprocess.Popen(args.command, cwd=REPO)
    try:
        code = suite.wait()
    except KeyboardInterrupt:
        suite.send_signal(signal.SIGINT)
        code = suite.wait()
    sampler.stopped.set()
    thread.join()
    sampler.charge_exited()
    accounting.stop()
    result = {"command": args.command, "exit_code": code, "started_at": started_at,
              "wall_seconds": time.monotonic() - started,
              "busy_seconds": busy_seconds() - busy,
              "cores_by_minute": cores_by_minute(sampler.busy, started),
              "fixed_work_seconds": [round(seconds, 4) for seconds in sampler.speed],
              "charged": dict(sorted(sampler.charged.items(), key=lambda item: -item[1]))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=0))
    report(result, args.top)
    return code


if __name__ == "__main__":
    sys.exit(main())
