"""A stall's stacks: what forward-signals.sh prints, read back and reported (pure, no cluster)."""

from __future__ import annotations

import datetime

from airflow_volcano.observability.logs import LogCursor, emit_new_lines
from airflow_volcano.waiting.stalls import StackCollection, parse_stacks

from .test_status import pod

LIB = "/usr/lib/python3/dist-packages/torch/distributed"
# What forward-signals.sh printed for request 1764000000 in a worker (faulthandler's own format).
WORKER_LOG = [
    "epoch 1 done",
    "[airflow-volcano] stacks 1763999000: begin",  # an older request's answer
    "[airflow-volcano] stacks 1763999000: end",
    "[airflow-volcano] stacks 1764000000: begin",
    "[airflow-volcano] stacks 1764000000: process 7, RANK=1: python /scripts/train.py",
    "[airflow-volcano] stacks 1764000000: Thread 0x00007f1 (most recent call first):",
    '[airflow-volcano] stacks 1764000000:   File "/usr/lib/python3.11/threading.py", line 320 in wait',
    '[airflow-volcano] stacks 1764000000:   File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap',
    "[airflow-volcano] stacks 1764000000: ",
    "[airflow-volcano] stacks 1764000000: Current thread 0x00007f2 (most recent call first):",
    f'[airflow-volcano] stacks 1764000000:   File "{LIB}/c10d_logger.py", line 81 in wrapper',
    f'[airflow-volcano] stacks 1764000000:   File "{LIB}/distributed_c10d.py", line 2806 in all_reduce',
    '[airflow-volcano] stacks 1764000000:   File "/scripts/train.py", line 9 in <module>',
    "[airflow-volcano] stacks 1764000000: end",
]


def test_a_pods_answer_is_read_from_its_log_and_says_where_each_process_was():
    answer = parse_stacks("t-worker-0", WORKER_LOG, "1764000000")
    assert answer.complete and len(answer.processes) == 1
    process = answer.processes[0]
    assert process.about == "process 7, RANK=1: python /scripts/train.py"
    assert process.where() == ("wrapper (c10d_logger.py:81) in all_reduce (distributed_c10d.py:2806), from train.py:9 "
                               "in <module>")
    answer = [line.replace("1764000000", "2") for line in WORKER_LOG[3:6]]
    answer += ['[airflow-volcano] stacks 2:   File "/scripts/train.py", line 5 in <module>',
               "[airflow-volcano] stacks 2: end"]
    sleeping = parse_stacks("t-worker-1", answer, "2")
    assert sleeping.processes[0].where() == "<module> (train.py:5)", "a C call (time.sleep) shows as its caller's line"
    incomplete = parse_stacks("t-worker-0", WORKER_LOG[:8], "1764000000")
    assert not incomplete.complete and incomplete.processes


def test_the_report_shows_every_pods_stacks_under_its_name_and_says_which_did_not_answer():
    pods = [pod("t-master-0", "master", "Running"), pod("t-worker-0", "worker", "Running"),
            pod("t-tensorboard-0", "tensorboard", "Running"), pod("t-worker-1", "worker", "Succeeded")]
    collection = StackCollection.of(pods, "1764000000", skip_tasks=["tensorboard"])
    assert [name for name, _ in collection.pods] == ["t-master-0", "t-worker-0"], "Running training pods only"
    collection.log_read("t-worker-0", WORKER_LOG)
    assert collection.waiting_for() == [("t-master-0", None)]
    report = collection.report()
    assert report[0].startswith("[t-master-0] no stacks: no answer within 95s")
    assert "[t-worker-0] process 7, RANK=1: python /scripts/train.py" in report
    assert '[t-worker-0]     File "/scripts/train.py", line 9 in <module>' in report
    assert collection.where() == ("where each process was: t-worker-0 (pid 7, RANK=1) in wrapper (c10d_logger.py:81) "
                                  "in all_reduce (distributed_c10d.py:2806), from train.py:9 in <module>")


def test_heartbeats_and_stack_lines_count_as_output_but_are_not_copied_into_the_task_log():
    cursor, shown = LogCursor(), []
    lines = ["2026-11-24T10:00:01.000000001Z step 1", "2026-11-24T10:00:31.000000001Z [airflow-volcano] heartbeat",
             "2026-11-24T10:00:40.000000001Z [airflow-volcano] stacks 1: begin"]
    emit_new_lines(lines, cursor, lambda line, at: shown.append(line))
    assert shown == ["step 1"]
    assert cursor.last_line_at == datetime.datetime(2026, 11, 24, 10, 0, 40, tzinfo=datetime.UTC).timestamp()
