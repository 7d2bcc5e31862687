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


def test_lines_split_across_chunks_anywhere_come_out_whole_and_decoded():
    from airflow_volcano.logs import LineSplitter

    data = "a 训练\n".encode() + b"b \xff\n" + "c 训练\n".encode() + "d 末".encode()
    expected = ["a 训练", "b \ufffd", "c 训练", "d 末"]
    for cut in range(1, len(data)):  # every place a chunk can end: inside a line, inside a character
        splitter = LineSplitter()
        lines = splitter.feed(data[:cut]) + splitter.feed(data[cut:]) + splitter.end()
        assert lines == expected, cut
    one_byte_at_a_time = LineSplitter()
    lines = [line for byte in data for line in one_byte_at_a_time.feed(bytes([byte]))] + one_byte_at_a_time.end()
    assert lines == expected
    long_line = "训练".encode() * 100_000  # one line over many chunks
    splitter = LineSplitter()
    pieces = [long_line[i:i + 65536] for i in range(0, len(long_line), 65536)]
    lines = [line for piece in pieces for line in splitter.feed(piece)] + splitter.feed(b"\nnext") + splitter.end()
    assert lines == ["训练" * 100_000, "next"]
