"""A stalled Job's Python stacks: asked for through a pod annotation, read back from the pods' logs.

Pure: the drivers (job_runner's and the trigger's) annotate the pods and read their logs;
`StackCollection` says which pods to ask, takes what their logs say, and writes the report.

In each training container, shell/forward-signals.sh watches the pod's annotations (mounted with
the downward API) and, when STACKS_REQUEST_ANNOTATION takes a new value, has every Python process
registered by shell/stack_dumps.py (faulthandler) write the stack of each of its threads, printing
them as log lines `[airflow-volcano] stacks <request>: ...` between a `begin` and an `end`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_volcano.constants import LABEL_PREFIX, TASK_LABEL, PodPhase
from airflow_volcano.observability.logs import STACKS_PREFIX

STACKS_REQUEST_ANNOTATION = f"{LABEL_PREFIX}dump-stacks"
# How long the drivers wait for the pods to answer: the kubelet rewrites the annotations file within
# seconds of the change (0.3-1.2 s measured on an idle v1.35 node), and forward-signals.sh looks at it
# every 2 s; a busy kubelet took over 30 s for one pod of three, twice in the suite's runs on v1.35, and
# once over 60 s (CI, stop 52). Its periodic sync of each pod, which rewrites the file too, comes at the
# latest 90 s after the last one (syncFrequency, 1 min by default, plus up to 50 % jitter: the kubelet's
# pod_workers.go). Waiting costs nothing once every pod answered.
STACKS_WAIT_SECONDS = 95.0
STACKS_POLL_SECONDS = 2.0
# What one read of a pod's log for its stacks may bring (the apiserver's limitBytes): the stacks of a
# pod's processes are a few KiB; a pod that prints a great deal meanwhile must not fill the waiter's
# memory (in the triggerer, every trigger's). Reached: said in the report.
STACKS_MAX_BYTES = 1024 * 1024
# Of a stall's report, what the wait's outcome keeps (the task log has it all): the panel shows it.
STACKS_KEPT_BYTES = 32 * 1024
FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<function>.+)$')
# Files of Python itself and of installed packages: the user's own frame is the first one outside them.
LIBRARY_PATH = re.compile(r"/(lib/python[\d.]*|site-packages|dist-packages)/")


@dataclass
class ProcessStacks:
    """What one Python process of a pod wrote: `process <pid>, <RANK=..>: <command>`, then each
    thread's stack (faulthandler's format, most recent call first)."""

    about: str
    lines: list[str] = field(default_factory=list)

    def where(self) -> str:
        """Briefly, where the main thread was: its innermost frames (two at most) down to the user's
        own code (`wrapper (c10d_logger.py:81) in all_reduce (distributed_c10d.py:2806), from
        train.py:9 in <module>`)."""
        frames = self._main_thread_frames()
        if not frames:
            return "no Python stack"
        own = next((index for index, frame in enumerate(frames) if not LIBRARY_PATH.search(frame["file"])), None)
        inner = frames[:min(2, len(frames) if own is None else max(own, 1))]
        text = " in ".join(f"{frame['function']} ({_short(frame['file'])}:{frame['line']})" for frame in inner)
        if own is not None and own >= len(inner):
            text += f", from {_short(frames[own]['file'])}:{frames[own]['line']} in {frames[own]['function']}"
        return text

    def _main_thread_frames(self) -> list[dict[str, str]]:
        threads: list[list[dict[str, str]]] = []
        for line in self.lines:
            if "thread 0x" in line.lower() and line.rstrip().endswith("(most recent call first):"):
                threads.append([])
            elif threads and (match := FRAME.match(line)):
                threads[-1].append(match.groupdict())
        # The thread running the script: its outermost frame is a module's (`<module>`).
        return next((frames for frames in threads if frames and frames[-1]["function"] == "<module>"),
                    threads[0] if threads else [])


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


@dataclass
class PodStacks:
    pod: str
    processes: list[ProcessStacks] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "no Python process is running in this container"
    complete: bool = False  # its `end` line was seen


def parse_stacks(pod: str, lines: Iterable[str], request: str) -> PodStacks:
    """The answer to `request` among a pod's log lines (messages, without timestamps)."""
    prefix = f"{STACKS_PREFIX}{request}: "
    found = PodStacks(pod)
    started = False
    for line in lines:
        if not line.startswith(prefix):
            continue
        body = line[len(prefix):]
        if body == "begin":
            started, found = True, PodStacks(pod)  # a repeated request's answer replaces an older one
        elif not started:
            continue
        elif body == "end":
            found.complete = True
        elif body.startswith("process "):
            found.processes.append(ProcessStacks(about=body))
        elif found.processes:
            found.processes[-1].lines.append(body)
        elif body.strip():
            found.notes.append(body)
    return found


@dataclass
class StackCollection:
    """One stall's request for stacks, and the answers as they come in."""

    request: str
    pods: list[tuple[str, str | None]]  # (pod, its first container): the Running training pods
    answers: dict[str, PodStacks] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)  # pod -> why it could not be asked
    capped: set[str] = field(default_factory=set)  # pods whose log read reached STACKS_MAX_BYTES
    uids: dict[str, str] = field(default_factory=dict)  # pod -> its uid (a restart deletes exactly it)

    @classmethod
    def of(cls, pods: Sequence[Mapping[str, Any]], request: str, skip_tasks: Iterable[str] = ()) -> StackCollection:
        """Ask every Running pod of the Job but those of `skip_tasks` (TensorBoard's)."""
        skipped = set(skip_tasks)
        chosen, uids = [], {}
        for pod in pods:
            metadata = pod.get("metadata") or {}
            if (pod.get("status") or {}).get("phase") != PodPhase.RUNNING or metadata.get("deletionTimestamp") or (
                    (metadata.get("labels") or {}).get(TASK_LABEL) in skipped):
                continue
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            chosen.append((metadata.get("name", ""), containers[0].get("name")))
            uids[metadata.get("name", "")] = metadata.get("uid", "")
        return cls(request=request, pods=sorted(chosen), uids=uids)

    def waiting_for(self) -> list[tuple[str, str | None]]:
        return [(pod, container) for pod, container in self.pods
                if pod not in self.unreachable and not (pod in self.answers and self.answers[pod].complete)]

    def log_read(self, pod: str, lines: Iterable[str], *, capped: bool = False) -> None:
        """A read of the pod's log since the request (messages without timestamps); `capped`: the read
        brought STACKS_MAX_BYTES, so later lines of it were not read."""
        self.answers[pod] = parse_stacks(pod, lines, self.request)
        if capped:
            self.capped.add(pod)

    def report(self) -> list[str]:
        """The task log's lines: each pod's processes and their stacks, each line under its pod."""
        lines = []
        for pod, _container in self.pods:
            answer = self.answers.get(pod)
            if pod in self.unreachable:
                lines.append(f"[{pod}] no stacks: {self.unreachable[pod]}")
            elif answer is None or not answer.complete and not answer.processes:
                lines.append(f"[{pod}] no stacks: no answer within {STACKS_WAIT_SECONDS:.0f}s (its command does "
                             "not run under airflow-volcano's shell: an image entrypoint, or a pod of a template "
                             "with its own command wrapper? Or its node's kubelet did not pass the request on)")
            else:
                lines.extend(f"[{pod}] {note}" for note in answer.notes)
                for process in answer.processes:
                    lines.append(f"[{pod}] {process.about}")
                    lines.extend(f"[{pod}]   {line}" for line in process.lines if line.strip())
            if pod in self.capped and not (answer and answer.complete):
                lines.append(f"[{pod}] (its log since the request passed {STACKS_MAX_BYTES // 1024} KiB, the most "
                             "read for stacks: what came later was not read)")
        return lines

    def where(self) -> str:
        """Briefly, where each process was: `pod (pid 7, RANK=1) in <module> (train.py:9); ...`."""
        parts = []
        for pod, _container in self.pods:
            answer = self.answers.get(pod)
            for process in answer.processes if answer else []:
                who = process.about.split(": ", 1)[0].removeprefix("process ")
                parts.append(f"{pod} (pid {who}) in {process.where()}")
        return "where each process was: " + "; ".join(parts) if parts else ""


def describe_silence(seconds: float) -> str:
    """`1 minute`, `90 seconds`: how long a stall's silence lasted, as stall_timeout was given."""
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return f"{minutes} minute{'' if minutes == 1 else 's'}"
    return f"{seconds:g} seconds"


def stall_notice(namespace: str, name: str, silent_for: float) -> str:
    return (f"Volcano Job {namespace}/{name} gave no output and no change for {silent_for:.0f}s "
            "(stall_timeout): asking its pods for their Python stacks")


def kept_lines(lines: Iterable[str], limit: int = STACKS_KEPT_BYTES) -> tuple[str, ...]:
    """A stall's report as far as `limit` bytes, saying so when cut (the task log has the rest)."""
    kept: list[str] = []
    size = 0
    for line in lines:
        size += len(line.encode()) + 1
        if size > limit:
            kept.append(f"[... cut at {limit // 1024} KiB: the rest of the stacks are in the task log]")
            break
        kept.append(line)
    return tuple(kept)
