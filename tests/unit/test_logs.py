"""Log cursor: resuming a dropped stream shows every line exactly once; a deleted pod's last line is
copied though the pod goes right after."""

from __future__ import annotations

import time

from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.observability.logs import LogCursor, emit_new_lines
from airflow_volcano.observability.pod_logs import PodLogCopy, follow_until_exit
from airflow_volcano.timestamps import parse_timestamp_ns


def stamp(second: int, nanos: int = 0) -> str:
    return f"2026-11-22T10:00:{second:02d}.{nanos:09d}Z"


def test_parse_timestamp_handles_trimmed_nanoseconds():
    assert parse_timestamp_ns("2026-11-22T10:00:01.5Z") - parse_timestamp_ns("2026-11-22T10:00:01Z") == 500_000_000
    assert parse_timestamp_ns("not-a-time") is None


def test_a_pod_read_through_the_clients_models_keeps_its_times():
    """The sync hook reads pods as the client's models and turns them back into dicts: its times come
    back as `+00:00`, not `Z`. The report of the pod that failed first still says when."""
    import datetime

    from kubernetes import client

    from airflow_volcano.status import failed_pods

    finished = datetime.datetime(2026, 11, 22, 10, 0, 3, tzinfo=datetime.UTC)
    pod = client.ApiClient().sanitize_for_serialization(client.V1Pod(
        metadata=client.V1ObjectMeta(name="train-worker-0", labels={"volcano.sh/task-spec": "worker"}),
        status=client.V1PodStatus(phase="Failed", container_statuses=[client.V1ContainerStatus(
            name="worker", image="i", image_id="", ready=False, restart_count=0,
            state=client.V1ContainerState(terminated=client.V1ContainerStateTerminated(
                exit_code=1, finished_at=finished, reason="Error")))])))
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] == "2026-11-22T10:00:03+00:00"
    [problem] = failed_pods([pod], "master")
    assert problem.finished_at == finished.timestamp()


def test_reread_after_drop_skips_what_was_shown():
    shown: list[str] = []
    cursor = LogCursor()
    first = [f"{stamp(1)} a", f"{stamp(2)} b", f"{stamp(2)} c"]
    emit_new_lines(first, cursor, lambda line, at: shown.append(line))
    # The stream dropped; the re-read starts a little earlier and repeats lines.
    again = [f"{stamp(1)} a", f"{stamp(2)} b", f"{stamp(2)} c", f"{stamp(2)} d", f"{stamp(3)} e"]
    emit_new_lines(again, cursor, lambda line, at: shown.append(line))
    assert shown == ["a", "b", "c", "d", "e"]
    assert cursor.lines_shown == 5


# What the kubelet answers, with status 200, for the log of a container it no longer has (seen in a
# test that read a finished worker's log as its pod went).
KUBELET_GONE = "unable to retrieve container logs for containerd://eade9b55fff5a21fc67badcd0dd4a1838b41aa51c2d8e3"


def test_the_kubelets_own_message_is_never_copied_as_the_containers_line_nor_once_per_read():
    shown: list[str] = []
    cursor = LogCursor()
    emit_new_lines([f"{stamp(1)} a", f"{stamp(2)} b"], cursor, lambda line, at: shown.append(line))
    for _ in range(3):  # each read after the container went: the kubelet's message again
        emit_new_lines([KUBELET_GONE], cursor, lambda line, at: shown.append(line))
    emit_new_lines([f"{stamp(1)} a", f"{stamp(2)} b", f"{stamp(3)} c"], cursor, lambda line, at: shown.append(line))
    assert shown == ["a", "b", "c"]
    assert cursor.lines_shown == 3 and cursor.last_line_at == parse_timestamp_ns(stamp(3)) // 10**9


def test_a_failed_pods_log_tail_is_its_containers_lines_not_the_kubelets_message():
    from airflow_volcano.status import PodLogTail

    tail = PodLogTail.from_raw([f"{stamp(1)} RuntimeError: boom", KUBELET_GONE])
    assert tail.lines == ("RuntimeError: boom",) and tail.last_ns == parse_timestamp_ns(stamp(1))


def test_cursor_survives_serialisation_between_trigger_and_worker():
    shown: list[str] = []
    cursor = LogCursor()
    emit_new_lines([f"{stamp(1)} a", f"{stamp(1)} b"], cursor, lambda line, at: shown.append(line))
    resumed = LogCursor.from_dict(cursor.to_dict())
    emit_new_lines([f"{stamp(1)} a", f"{stamp(1)} b", f"{stamp(4)} z"], resumed, lambda line, at: shown.append(line))
    assert shown == ["a", "b", "z"]


def test_a_read_resumes_at_or_before_the_last_line():
    from airflow_volcano.hooks.calls import since_time

    cursor = LogCursor(last_ns=parse_timestamp_ns(stamp(10)) + 999_999_999)
    assert cursor.last_line_at is not None
    assert parse_timestamp_ns(since_time(cursor.last_line_at)) <= cursor.last_ns, "rounded down, never past it"
    assert LogCursor().last_line_at is None


def test_lines_split_across_chunks_anywhere_come_out_whole_and_decoded():
    from airflow_volcano.observability.logs import LineSplitter

    data = "a 训练\n".encode() + b"b \xff\n" + "c 训练\n".encode() + "d 末".encode()
    expected = ["a 训练", "b \ufffd", "c 训练", "d 末"]
    for cut in range(1, len(data)):  # every place a chunk can end: inside a line, inside a character
        splitter = LineSplitter()
        lines = splitter.feed(data[:cut]) + splitter.feed(data[cut:]) + splitter.end()
        assert lines == expected, cut
    one_byte_at_a_time = LineSplitter()
    lines = [line for byte in data for line in one_byte_at_a_time.feed(bytes([byte]))] + one_byte_at_a_time.end()
    assert lines == expected
    long_line = "训练".encode() * 10_000  # one line over many chunks (60 KB, within the cut)
    splitter = LineSplitter()
    pieces = [long_line[i:i + 4096] for i in range(0, len(long_line), 4096)]
    lines = [line for piece in pieces for line in splitter.feed(piece)] + splitter.feed(b"\nnext") + splitter.end()
    assert lines == ["训练" * 10_000, "next"]


def test_a_line_without_end_is_cut_and_says_so_in_bounded_memory():
    import tracemalloc

    from airflow_volcano.observability.logs import MAX_LINE_BYTES, LineSplitter

    splitter = LineSplitter()
    tracemalloc.start()
    lines = []
    for _ in range(800):  # 50 MiB without a newline, in 64 KiB chunks
        lines += splitter.feed(b"x" * 65536)
        lines += splitter.feed(b"")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    lines += splitter.feed(b"\nafter\n") + splitter.end()
    assert peak < 4 * MAX_LINE_BYTES, f"held {peak} bytes"
    assert lines == ["x" * MAX_LINE_BYTES + f" [... line cut: {800 * 65536 - MAX_LINE_BYTES} more bytes not shown]",
                     "after"]
    assert LineSplitter(10).feed(b"0123456789abc\n12\n0123456789" + "训".encode() + b"\n") == [
        "0123456789 [... line cut: 3 more bytes not shown]", "12", "0123456789 [... line cut: 3 more bytes not shown]"]


def test_control_characters_are_shown_escaped_and_cannot_move_the_cursor():
    from airflow_volcano.observability.logs import LineSplitter

    raw = (f"{stamp(1)} x\r2999-01-01T00:00:00Z forged\n{stamp(2)} \x1b[31mred\x1b[0m\ttab 10%\r 20%\r\n"
           f"{stamp(3)} bell\x07 nul\x00 sep\u2028end\n{stamp(4)} last\n").encode()
    shown: list[str] = []
    cursor = LogCursor()
    emit_new_lines(LineSplitter().feed(raw), cursor, lambda line, at: shown.append(line))
    # A carriage return redraws the line: what follows its last one is shown (as a terminal would), after the
    # kubelet's timestamp, which stays the line's.
    assert shown == ["2999-01-01T00:00:00Z forged", " 20%", "bell\\x07 nul\\x00 sep\\u2028end", "last"]
    assert cursor.last_ns == parse_timestamp_ns(stamp(4)), "the forged year 2999 is not a timestamp of ours"


def test_a_line_a_progress_bar_redrew_is_shown_as_its_latest_state():
    """tqdm redraws with carriage returns; the runtime ends a log line only at a newline: 150 s of a bar
    came into the task log as one 14,222-character line of 301 redraws (issue 41)."""
    from airflow_volcano.observability.logs import LineSplitter, latest_state

    shown: list[str] = []
    bar = "\r".join(f"epoch 1: {percent:3d}%|{'#' * (percent // 10)}" for percent in range(0, 101, 5))
    raw = f"{stamp(1)} \r{bar}\n{stamp(2)} plain line\n".encode()
    emit_new_lines(LineSplitter().feed(raw), LogCursor(), lambda line, at: shown.append(line))
    assert shown == ["epoch 1: 100%|##########", "plain line"]
    assert latest_state("windows line\r") == "windows line", "a CR before the newline is no redraw"
    assert latest_state("\r\r") == ""


class DeletedPod:
    """A master pod after its Job was deleted, as the kubelet treats it: its SIGTERM handler prints its
    last line `last_line_at` seconds from now, its container exits then, and the pod (its log with it) is
    removed `removed_after` later, well within the one second a reader polling every second waits."""

    LINE = "SIGTERM: saved checkpoint epoch 7"

    def __init__(self, last_line_at: float = 0.3, removed_after: float = 0.2) -> None:
        self.start, self.last_line_at, self.removed_after = time.monotonic(), last_line_at, removed_after

    def _now(self) -> float:
        return time.monotonic() - self.start

    def _gone(self) -> bool:
        return self._now() >= self.last_line_at + self.removed_after

    def _written(self) -> bytes:
        return f"{stamp(7)} {self.LINE}\n".encode() if self._now() >= self.last_line_at else b""

    def get_pod(self, name: str, namespace: str) -> dict | None:
        if self._gone():
            return None
        state = {"terminated": {"exitCode": 143}} if self._now() >= self.last_line_at else {"running": {}}
        return {"spec": {"terminationGracePeriodSeconds": 5},
                "status": {"phase": "Running", "containerStatuses": [{"name": "master", "state": state}]}}

    def _absent(self) -> Exception:
        return VolcanoApiError("read log of pod ml/train-master-0", 404, "Not Found")

    def pod_log_chunks(self, name: str, namespace: str, **kwargs: object) -> object:
        if self._gone():
            raise self._absent()
        yield self._written()

    def stream_pod_log(self, name: str, namespace: str, **kwargs: object) -> object:
        """A followed log: each line as it is written; it ends when the container exits."""
        if self._gone():
            raise self._absent()
        time.sleep(max(0.0, self.last_line_at - self._now()))
        return iter([self._written()])


def test_a_deleted_pods_last_line_reaches_the_task_log_though_the_pod_goes_right_after():
    """After job_timeout deletes the Job, the line a SIGTERM handler prints as it exits is copied, though
    the kubelet removes the pod (and its log) a moment later: the log is followed, not read now and then
    (a read every second lost it on the real node)."""
    shown: list[str] = []
    follow_until_exit(DeletedPod(), "ml", PodLogCopy("train-master-0", "master", lambda line, at: shown.append(line)))
    assert shown == [DeletedPod.LINE]
