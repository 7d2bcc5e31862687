"""Log cursor: resuming a dropped stream shows every line exactly once."""

from __future__ import annotations

from airflow_volcano.logs import LogCursor, emit_new_lines, parse_timestamp_ns


def stamp(second: int, nanos: int = 0) -> str:
    return f"2026-11-22T10:00:{second:02d}.{nanos:09d}Z"


def test_parse_timestamp_handles_trimmed_nanoseconds():
    assert parse_timestamp_ns("2026-11-22T10:00:01.5Z") - parse_timestamp_ns("2026-11-22T10:00:01Z") == 500_000_000
    assert parse_timestamp_ns("not-a-time") is None


def test_reread_after_drop_skips_what_was_shown():
    shown: list[str] = []
    cursor = LogCursor()
    first = [f"{stamp(1)} a", f"{stamp(2)} b", f"{stamp(2)} c"]
    emit_new_lines(first, cursor, shown.append)
    # The stream dropped; the re-read starts a little earlier and repeats lines.
    again = [f"{stamp(1)} a", f"{stamp(2)} b", f"{stamp(2)} c", f"{stamp(2)} d", f"{stamp(3)} e"]
    emit_new_lines(again, cursor, shown.append)
    assert shown == ["a", "b", "c", "d", "e"]
    assert cursor.lines_shown == 5


def test_cursor_survives_serialisation_between_trigger_and_worker():
    shown: list[str] = []
    cursor = LogCursor()
    emit_new_lines([f"{stamp(1)} a", f"{stamp(1)} b"], cursor, shown.append)
    resumed = LogCursor.from_dict(cursor.to_dict())
    emit_new_lines([f"{stamp(1)} a", f"{stamp(1)} b", f"{stamp(4)} z"], resumed, shown.append)
    assert shown == ["a", "b", "z"]


def test_since_seconds_reaches_back_past_the_last_line():
    cursor = LogCursor(last_ns=parse_timestamp_ns(stamp(10)))
    now = parse_timestamp_ns(stamp(20)) / 1e9
    assert cursor.since_seconds(now) >= 10
    assert LogCursor().since_seconds(now) is None


def test_a_capped_read_keeps_whole_lines_and_decodes_what_is_not_utf8():
    from airflow_volcano.logs import complete_lines

    data = "a 训练\n".encode() + b"b \xff\n" + "c 训练".encode()
    cut = data[:-2]  # the cap fell inside the last character
    assert complete_lines(cut, limit=len(cut)) == ["a 训练", "b \ufffd"], "the cut line waits for the next read"
    assert complete_lines(data, limit=len(data) + 1) == ["a 训练", "b \ufffd", "c 训练"], "under the cap: all"
    long_line = "训".encode() * 10
    assert complete_lines(long_line[:-1], limit=29) == ["训" * 9 + "\ufffd"], "one line over the cap is shown cut"
