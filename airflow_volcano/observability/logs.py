"""Following the master pod's log into the task log, without losing or repeating lines.

Lines are read with `timestamps=true`. A `LogCursor` remembers the newest timestamp shown and how
many lines carried it, so when a stream drops (or a deferred task resumes) the log is read again
from shortly before that point and everything already shown is skipped. The cursor is pure and
serialisable; the follower thread is the only part that does I/O.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_volcano.timestamps import parse_timestamp_ns
from airflow_volcano.waiting.progress import PROGRESS_MARKER, Progress

Emit = Callable[[str], None]
# Where a copied log line goes: its text, and when the pod printed it (the node's nanoseconds), if known.
LineEmit = Callable[[str, int | None], None]


# The convention a training script follows to say where it resumed: a line of its main pod's log
# (after any logging prefix) `[airflow-volcano] resumed from <checkpoint>`.
RESUMED_FROM_MARKER = "[airflow-volcano] resumed from "
MAX_RESUMED_FROM = 1024
# Lines forward-signals.sh prints (stall_timeout): a heartbeat, which counts as output but is not
# shown, and the Python stacks a stall asked for, shown together by the stall's report instead.
HEARTBEAT_LINE = "[airflow-volcano] heartbeat"
STACKS_PREFIX = "[airflow-volcano] stacks "


def stamped_line(raw_line: str) -> tuple[int, str] | None:
    """A line of a log read with timestamps=true as (nanoseconds on the node's clock, message); None for
    a line without the kubelet's timestamp. Every line the container wrote has one: a line without is
    the kubelet's own word, never the training's. (Its container gone, the kubelet answers 200 with
    "unable to retrieve container logs for containerd://..." as the body: not a line to copy, and,
    without a timestamp, one the cursor could not tell from the last read's.)"""
    stamp, _, message = raw_line.partition(" ")
    at = parse_timestamp_ns(stamp)
    return None if at is None else (at, message)


@dataclass
class LogCursor:
    """How far a log has been shown: the newest line's timestamp, and how many lines had it; the
    checkpoint the training last said it resumed from (a line with RESUMED_FROM_MARKER); and the
    progress it reported (`progress.PROGRESS_MARKER`)."""

    last_ns: int = 0
    seen_at_last: int = 0
    lines_shown: int = 0
    resumed_from: str | None = None
    progress: Progress | None = None
    _seen_this_read: int = field(default=0, repr=False)

    def start_read(self) -> None:
        """Call before reading a stream that may repeat lines shown before."""
        self._seen_this_read = 0

    def accept(self, raw_line: str) -> str | None:
        """The line's message if it is new; None if it was shown already, or is not the container's
        (`stamped_line`)."""
        if (line := stamped_line(raw_line)) is None:
            return None
        at, message = line
        if at < self.last_ns:
            return None
        if at == self.last_ns:
            self._seen_this_read += 1
            if self._seen_this_read <= self.seen_at_last:
                return None
            self.seen_at_last += 1
        else:
            self.last_ns, self.seen_at_last, self._seen_this_read = at, 1, 1
        self.lines_shown += 1
        return message

    @property
    def last_line_at(self) -> float | None:
        """The whole second (epoch, the node's clock) of the newest line read (a hidden heartbeat too), if
        any: where a read resumes (None: from the start). Rounded down in integers: a float of the
        nanoseconds rounds .999999999 up into the next second, whose read would skip that line."""
        return float(self.last_ns // 1_000_000_000) if self.last_ns else None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"last_ns": self.last_ns, "seen_at_last": self.seen_at_last,
                                "lines_shown": self.lines_shown}
        if self.resumed_from is not None:
            data["resumed_from"] = self.resumed_from
        if self.progress is not None:
            data["progress"] = self.progress.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LogCursor:
        data = dict(data or {})
        progress = data.pop("progress", None)
        return cls(**data, progress=Progress.from_dict(progress) if progress else None)

    def progress_line(self, message: str) -> str | None:
        """A progress line of the training's: what to show for it now (None: counted, not shown)."""
        if self.progress is None:
            self.progress = Progress()
        return self.progress.observe(message, self.last_ns)


def latest_state(message: str) -> str:
    """A line a progress bar redrew with carriage returns (tqdm), as a terminal would leave it: the text
    after its last carriage return that has any. (The container runtime ends a log line only at a newline,
    so a bar redrawn for minutes is one line of every redraw.)"""
    if "\r" not in message:
        return message
    return next((part for part in reversed(message.split("\r")) if part.strip()), "")


def hidden(message: str) -> bool:
    """A line of ours that the task log does not show as it comes (see HEARTBEAT_LINE)."""
    return message == HEARTBEAT_LINE or message.startswith(STACKS_PREFIX)


def emit_new_lines(lines: Iterable[str], cursor: LogCursor, emit: LineEmit,
                   on_new: Callable[[], None] | None = None) -> int:
    """Show the lines of one read that the cursor has not shown yet; returns how many."""
    cursor.start_read()
    return emit_unseen(lines, cursor, emit, on_new)


def emit_unseen(lines: Iterable[str], cursor: LogCursor, emit: LineEmit,
                on_new: Callable[[], None] | None = None) -> int:
    """As emit_new_lines, for the next lines of a read already started (`cursor.start_read()`).
    `on_new` is told of every new line, the hidden ones too (a heartbeat is output)."""
    shown = 0
    for line in lines:
        if not line:
            continue
        message = cursor.accept(line)
        if message is None:
            continue
        if on_new is not None:
            on_new()
        if hidden(message):
            continue
        if PROGRESS_MARKER in message:  # shown as percent, rate and ETA, when due
            if (message := cursor.progress_line(message)) is None:
                continue
        emit(message, cursor.last_ns or None)
        shown += 1
        if RESUMED_FROM_MARKER in message:
            cursor.resumed_from = message.split(RESUMED_FROM_MARKER, 1)[1].strip()[:MAX_RESUMED_FROM] or None
    return shown


class OutputSight(Protocol):
    """What a log reader tells of its sight (wait_engine.OutputClock)."""

    def seen(self, now: float) -> None: ...

    def blind(self, source: str, now: float) -> None: ...

    def sighted(self, source: str, now: float) -> None: ...


class LogFollower(threading.Thread):
    """Follows one pod's log in the background until stopped, reconnecting when the stream drops.

    `open_stream(since)` (an epoch time, None: from the start) returns an iterable of raw lines (and
    may have a `close()`); it raises LookupError while the pod does not exist or has not started yet
    (nothing to see), anything else when the log cannot be read. `output` (if given) is told what this
    follower sees, as `source`: each new line, and whether the log can be read, at `clock` (the
    waiter's own). `finished` (if given) is asked each time a stream ends or cannot be opened: True
    ends the follower (its container has exited, so the stream that ended held its last line).
    """

    def __init__(self, open_stream: Callable[[float | None], Any], cursor: LogCursor, emit: LineEmit,
                 retry_interval: float = 2.0, *, output: OutputSight | None = None, source: str = "",
                 clock: Callable[[], float] = time.monotonic, finished: Callable[[], bool] | None = None) -> None:
        super().__init__(name="volcano-log-follower", daemon=True)
        self.open_stream = open_stream
        self.cursor = cursor
        self.emit = emit
        self.retry_interval = retry_interval
        self.output, self.source, self.clock = output, source, clock
        self.finished = finished
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None

    def _seen(self) -> None:
        if self.output is not None:
            self.output.seen(self.clock())

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                stream = self.open_stream(self.cursor.last_line_at)
                with self._lock:
                    if self._stop_event.is_set():
                        _close(stream)
                        return
                    self._stream = stream
                if self.output is not None:
                    self.output.sighted(self.source, self.clock())
                emit_new_lines(iter_lines(stream), self.cursor, self.emit, self._seen)
            except LookupError:  # the pod has not started (or is gone): nothing to see, not blind
                if self.output is not None:
                    self.output.sighted(self.source, self.clock())
            except Exception:  # noqa: BLE001 - the stream dropped or cannot be opened: blind until it is again
                if self.output is not None and not self._stop_event.is_set():
                    self.output.blind(self.source, self.clock())
            finally:
                with self._lock:
                    _close(self._stream)
                    self._stream = None
            if self.finished is not None and not self._stop_event.is_set() and self.finished():
                return
            if self._stop_event.wait(self.retry_interval):
                return

    def stop(self, timeout: float = 5) -> None:
        self._stop_event.set()
        with self._lock:
            stream = self._stream
        # shutdown() unblocks a read in progress in the other thread (close() would wait for it).
        shutdown = getattr(stream, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # noqa: BLE001 - already closed
                pass
        self.join(timeout)


# Control characters (but tab) and Unicode line separators would move the cursor of a terminal or
# log viewer (tqdm's `\r` redraws, ANSI colours, a forged line of its own): shown escaped instead.
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
LOG_CHUNK_BYTES = 64 * 1024  # what copying a log holds in memory at a time, in either mode
# A longer line is cut (and says so): a pod printing without newlines must not grow our memory.
MAX_LINE_BYTES = 64 * 1024


ESCAPES = {"\r": "\\r", "\n": "\\n", "\x1b": "\\x1b"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def decode_line(line: bytes) -> str:
    """One log line as text safe to print: invalid UTF-8 (a script may print anything) becomes
    U+FFFD, a CRLF's CR dropped, a line redrawn with carriage returns (a progress bar) kept as its
    latest state (after the kubelet's timestamp, which stays the line's), and the other control
    characters but tab escaped (`\x1b`)."""
    text = line.decode("utf-8", errors="replace")
    text = text.removesuffix("\r")
    if "\r" in text:
        stamp, space, rest = text.partition(" ")
        text = f"{stamp} {latest_state(rest)}" if space and parse_timestamp_ns(stamp) is not None \
            else latest_state(text)
    return CONTROL.sub(_escape, text)


class LineSplitter:
    """A log's bytes, fed in chunks as they arrive, as whole lines decoded one by one: a chunk may
    end inside a line or inside a multi-byte character; that part waits for the next chunk. A line
    longer than `max_line_bytes` keeps only its beginning, with a note of how much was cut, so the
    memory held is bounded whatever the pod prints."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._pending: list[bytes] = []  # the unfinished line's parts: joined once, however long it gets
        self._pending_bytes = 0
        self._cut = 0  # bytes of the unfinished line dropped past max_line_bytes

    def feed(self, chunk: bytes) -> list[str]:
        if b"\n" not in chunk:
            self._keep(chunk)
            return []
        first, *middle, rest = chunk.split(b"\n")
        self._keep(first)
        lines = [self._line()]
        for line in middle:
            if len(line) <= self.max_line_bytes:
                lines.append(decode_line(line))
            else:
                self._keep(line)
                lines.append(self._line())
        self._keep(rest)
        return lines

    def end(self) -> list[str]:
        return [self._line()] if self._pending_bytes or self._cut else []

    def _keep(self, part: bytes) -> None:
        room = self.max_line_bytes - self._pending_bytes
        if len(part) > room:
            self._cut += len(part) - room
            part = part[:room]
        if part:
            self._pending.append(part)
            self._pending_bytes += len(part)

    def _line(self) -> str:
        text = decode_line(b"".join(self._pending))
        if self._cut:
            # A cut may fall inside a character: its first bytes decode as U+FFFD, not worth showing.
            text = f"{text.rstrip(chr(0xFFFD))} [... line cut: {self._cut} more bytes not shown]"
        self._pending, self._pending_bytes, self._cut = [], 0, 0
        return text


def iter_lines(stream: Any) -> Iterator[str]:
    """Lines of a urllib3 response (or any iterable of str/bytes chunks). A followed log arrives
    chunked, so a read returns what has arrived (up to 64 KiB) without waiting for more."""
    chunks = stream.stream(65536, decode_content=True) if hasattr(stream, "stream") else stream
    splitter = LineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk.encode() if isinstance(chunk, str) else chunk)
    yield from splitter.end()


def _close(stream: Any) -> None:
    for method in ("close", "release_conn"):
        closer = getattr(stream, method, None)
        if closer is not None:
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing a dead stream
                pass
