"""Progress as the main pod reports it: shown with percent, rate and ETA when due, redone steps once."""

from __future__ import annotations

from airflow_volcano.observability.logs import LogCursor, emit_new_lines
from airflow_volcano.waiting.progress import Progress, duration_text, report_progress

SECOND = 10**9
START = 1_767_261_600 * SECOND  # 2026-01-01T10:00:00Z


def stamp(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp((START + seconds * SECOND) / SECOND, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def copy(lines: list[tuple[float, str]], cursor: LogCursor | None = None) -> tuple[list[str], LogCursor]:
    cursor = cursor or LogCursor()
    shown: list[str] = []
    emit_new_lines([f"{stamp(at)} {text}" for at, text in lines], cursor, lambda message, ns: shown.append(message))
    return shown, cursor


def test_progress_is_shown_with_percent_rate_and_eta_at_most_per_minute_or_five_percent():
    lines = [(second, f"INFO [airflow-volcano] progress {second * 2}/1000 steps") for second in range(0, 120)]
    shown, cursor = copy(lines)
    assert shown[0] == "progress 0/1000 steps (0.0%)", "the first report, at once"
    assert shown[1] == "progress 50/1000 steps (5.0%), 2 steps/s, ETA 7m55s (10:08:20 UTC)", "5 % later"
    assert len(shown) == 5, "every 5 % (25 s here), not every line"
    assert cursor.progress is not None and cursor.progress.result() == {
        "done": 238.0, "total": 1000.0, "unit": "steps", "percent": 23.8, "rate_per_second": 2.0,
        "eta_seconds": 381.0, "resumes": 0, "redone": 0.0}


def test_slow_progress_is_shown_once_a_minute_and_the_end_at_once():
    lines = [(minute * 20, f"[airflow-volcano] progress {minute}/1000") for minute in range(0, 10)]
    lines.append((200, "[airflow-volcano] progress 1000/1000"))
    shown, _ = copy(lines)
    assert [line.split(" (")[0] for line in shown] == ["progress 0/1000", "progress 3/1000", "progress 6/1000",
                                                       "progress 9/1000", "progress 1000/1000"]


def test_a_resume_from_an_earlier_step_counts_the_redone_steps_once_and_restarts_the_rate():
    lines = [(0, "[airflow-volcano] progress 0/300"), (60, "[airflow-volcano] progress 120/300"),
             # a restart: the new gang resumed from the checkpoint of step 80
             (100, "[airflow-volcano] progress 80/300"), (130, "[airflow-volcano] progress 140/300"),
             # again, from 100
             (150, "[airflow-volcano] progress 100/300"), (250, "[airflow-volcano] progress 300/300")]
    shown, cursor = copy(lines)
    progress = cursor.progress
    assert progress is not None
    assert progress.redone == 40 + 40, "120 -> 80: 40 steps again; 140 -> 100: 40 more"
    assert progress.executed == 120 + 60 + 200 and progress.resumes == 2
    assert "resumed 1 time(s), 40 steps redone" in shown[2]
    assert progress.rate == 2.0, "measured over the current run only"
    assert shown[-1].startswith("progress 300/300 (100.0%), 2 steps/s; resumed 2 time(s), 80 steps redone")


def test_progress_travels_with_the_cursor_and_malformed_lines_are_shown_as_they_are():
    _, cursor = copy([(0, "[airflow-volcano] progress 10/100"), (10, "[airflow-volcano] progress 20/100")])
    again = LogCursor.from_dict(cursor.to_dict())
    assert again.progress == cursor.progress
    shown, _ = copy([(20, "[airflow-volcano] progress 30/100"), (21, "[airflow-volcano] progress bar broke")],
                    again)
    assert shown == ["progress 30/100 (30.0%), 1 steps/s, ETA 1m10s (10:01:30 UTC)",
                     "[airflow-volcano] progress bar broke"]


def test_the_helper_prints_the_line_the_provider_reads(capsys):
    report_progress(5, 50, "epochs")
    line = capsys.readouterr().out.strip()
    assert line == "[airflow-volcano] progress 5/50 epochs"
    progress = Progress()
    assert progress.observe(line, START) == "progress 5/50 epochs (10.0%)"


def test_durations_read_as_a_person_says_them():
    assert [duration_text(s) for s in (0.4, 45, 245, 7380)] == ["0s", "45s", "4m05s", "2h03m"]
