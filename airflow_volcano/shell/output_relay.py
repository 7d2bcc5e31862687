"""The output relay of a training container (stall_timeout): the command's stdout and stderr pass through it.

forward-signals.sh (and a DeepSpeed/MPI worker's ssh session) runs the command with its stdout and
stderr into two FIFOs and this file as `python3 -I -S output_relay.py OUT_FIFO ERR_FIFO`, which
copies each to its own stdout and stderr, byte for byte and at once, and touches $HEARTBEAT_FILE (at
most once a second) while bytes flow. The shell turns those touches into `[airflow-volcano]
heartbeat` log lines: a progress bar that redraws with `\\r` and never ends a line (the container
runtime hands the kubelet a partial line only at 16 KiB) is output, not a stall.

The one byte it adds: a newline after a redraw, at most every REDRAW_LINE_SECONDS, while a line keeps
being redrawn with `\\r`. The runtime then ends the log line there, so the bar's latest state reaches
the log (and the task log, which shows a redrawn line as its latest state) every few seconds instead
of once, as one line of every redraw, when the bar ends.

It must never make the command fail: it ignores SIGTERM, SIGINT, SIGQUIT and SIGHUP (the shell's
signals to every process of the container reach it too), and when its own output fails (EPIPE,
EIO) it goes on reading and dropping, so the command neither blocks nor dies of SIGPIPE. It ends at
the end of both streams; on SIGUSR1 (the shell, when a process the command left running keeps a
FIFO open) it copies what can be read at once and ends.

Standard library only, Python 3.6 syntax at most: it runs under whatever Python the image has.
"""

import os
import select
import signal
import sys
import time

CHUNK = 65536
HEARTBEAT_SECONDS = 1.0
REDRAW_LINE_SECONDS = 5.0
FLUSH_READS = 16  # on SIGUSR1: at most this many reads per stream (a writer may not stop)


def _write_all(fd: int, data: bytes, broken: set) -> None:
    view = memoryview(data)
    while view and fd not in broken:
        try:
            written = os.write(fd, view)
        except BlockingIOError:  # an output left non-blocking by someone else: wait until it takes more
            select.select([], [fd], [], 1.0)
            continue
        except OSError:  # EPIPE, EIO: nobody reads it any more; keep draining the command
            broken.add(fd)
            return
        view = view[written:]


def _touch(path: str) -> None:
    try:
        with open(path, "a"):
            pass
        os.utime(path, None)
    except OSError:
        pass


def _end_a_redrawn_line(fd: int, out: int, data: bytes, redrawn: dict, broken: set) -> None:
    """End the open line with a newline when it has been redrawn (carriage returns) for
    REDRAW_LINE_SECONDS: its latest state then reaches the log now, not when the bar ends."""
    newline = data.rfind(b"\n")
    if newline >= 0:
        redrawn.pop(fd, None)  # a line ended: what follows is a new one
    if b"\r" not in data[newline + 1:]:
        return
    now = time.monotonic()
    since = redrawn.setdefault(fd, now)
    if now - since >= REDRAW_LINE_SECONDS:
        _write_all(out, b"\n", broken)
        redrawn[fd] = now


def relay(streams: dict, heartbeat: str) -> None:
    """Copy each FIFO (fd -> the fd it goes to; removed once it ends) until both end, or SIGUSR1."""
    flush = []
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGUSR1, lambda *_: flush.append(True))
    poller = select.poll()
    for fd in (*streams, wake_read):
        poller.register(fd, select.POLLIN)
    broken: set = set()  # the output fds that failed (EPIPE, EIO): what is read for them is dropped
    redrawn: dict = {}  # fd -> since when its open line (no newline yet) is redrawn with carriage returns
    last_beat = 0.0
    while streams and not flush:
        for fd, _event in poller.poll():
            if fd == wake_read:
                try:
                    os.read(wake_read, 512)
                except OSError:
                    pass
                continue
            if fd not in streams:
                continue
            data = os.read(fd, CHUNK)
            if not data:
                poller.unregister(fd)
                os.close(fd)
                del streams[fd]
                continue
            _write_all(streams[fd], data, broken)
            _end_a_redrawn_line(fd, streams[fd], data, redrawn, broken)
            if heartbeat and time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                last_beat = time.monotonic()
                _touch(heartbeat)
    for fd, out in streams.items():  # asked to end: what can be read now
        os.set_blocking(fd, False)
        for _ in range(FLUSH_READS):
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                break
            if not data:
                break
            _write_all(out, data, broken)


def drop(streams: dict) -> None:
    """Read the FIFOs to their end, dropping the bytes: the command must keep a reader."""
    while streams:
        for fd in select.select(list(streams), [], [])[0]:
            if not os.read(fd, CHUNK):
                os.close(fd)
                del streams[fd]


def main(out_fifo: str, err_fifo: str, heartbeat: str) -> None:
    for name in ("SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    # Opened in the order the shell's redirections open them (stdout, then stderr): each open waits
    # for its writer.
    streams = {os.open(out_fifo, os.O_RDONLY): 1}
    streams[os.open(err_fifo, os.O_RDONLY)] = 2
    try:
        relay(streams, heartbeat)
    except Exception:  # noqa: BLE001 - a bug here must not end the command (SIGPIPE on a FIFO without reader)
        drop(streams)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], os.environ.get("HEARTBEAT_FILE", ""))
