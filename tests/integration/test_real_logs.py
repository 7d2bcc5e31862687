"""Every line of a followed pod reaches the task log, shown at the time the pod printed it: also the last
lines of a pod that ends or is deleted between two copies of a deferred wait (real node, real containers)."""

from __future__ import annotations

import datetime
import re

from .test_real_pods import real_operator, script

LAST_WORDS = """
    import os, time
    print(f"last words at {time.time():.3f}", flush=True)
    time.sleep(2)
    os._exit(137)  # as the OOM killer ends a process: retryable, so Volcano restarts, and removes the pod
"""


def stamped(log: str, text: str) -> tuple[float, str]:
    """The time a task log line shows, and the line, of the first line containing `text`."""
    line = next(line for line in log.splitlines() if text in line)
    return datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp(), line


def test_a_deferred_masters_last_line_before_it_dies_is_in_the_task_log_at_its_own_time(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path):
    """The trigger copies the log every 30 s; the master prints a line and is gone 2 s later (Volcano
    removes a failed pod when it restarts or ends the Job). The shared pod watch shows it ending: its log
    is copied then, and the line shows the time the master printed it, not the time it was copied."""
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "lastwords", worker_replicas=0, max_retry=1,
                                         training_script=script(tmp_path, LAST_WORDS), deferrable=True))

    assert run.state == "failed", run.log
    shown_at, line = stamped(run.log, "[lastwords-master-0] last words at ")
    printed_at = float(re.search(r"last words at (\d+\.\d+)", line).group(1))
    assert abs(shown_at - printed_at) < 1.0, f"shown at {shown_at}, printed at {printed_at}: {line}"
