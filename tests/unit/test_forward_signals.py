"""The shell every training container runs as PID 1 (shell/forward-signals.sh), its output relay and the
stack-dumping sitecustomize, run for real: real processes, real signals, under dash, busybox sh and
bash (each that this machine has; the Makefile's `shellcheck` target installs busybox and strace)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_volcano.shell import read

SHELLS = [shell for shell in (["dash"], ["busybox", "sh"], ["bash"]) if shutil.which(shell[0])]
SHELL_IDS = [" ".join(shell) for shell in SHELLS]
DASH = [shutil.which("dash") or "/bin/sh"]
PYTHON = sys.executable
ENOUGH = 20  # seconds: an upper bound no healthy step here comes near


@pytest.fixture(autouse=True, scope="module")
def signals_at_their_defaults():
    """The shells start as a container's PID 1 does, with every signal at its default action. A test run
    started in the background of a non-interactive shell inherits SIGINT and SIGQUIT ignored, which its
    children inherit in turn and a shell may not trap again (POSIX): restored for this module's run."""
    ignored = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGQUIT)
               if signal.getsignal(number) == signal.SIG_IGN}
    for number in ignored:
        signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
    yield
    for number, handler in ignored.items():
        signal.signal(number, handler)


def forwarder_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A container's environment, the run directory under tmp_path; python3 on PATH is this Python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python3").exists():
        (bin_dir / "python3").symlink_to(PYTHON)
    return {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "TMPDIR": str(tmp_path), "LANG": "C.UTF-8", **extra}


def start(shell: list[str], command: list[str], env: dict[str, str], **popen) -> subprocess.Popen:
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([*shell, "-c", read("forward-signals.sh"), "airflow-volcano-run", *command], env=env,
                            **popen)


def wait_for_file(path: Path, process: subprocess.Popen | None = None, timeout: float = ENOUGH) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert process is None or process.poll() is None, "ended early"
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return path.read_text()


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- signals ----------------------------------------------------------------------------------------------

# Says how it starts (its pid, its parent, what SIGINT and SIGQUIT do), then waits for a signal: on
# KeyboardInterrupt it exits 7, on SIGQUIT (its own handler) 9, on SIGTERM 42.
WAITS_FOR_A_SIGNAL = """\
import os, signal, sys, time
def on(number, frame):
    print("got", signal.Signals(number).name, flush=True)
    sys.exit({signal.SIGQUIT: 9, signal.SIGTERM: 42}[number])
quit_at_start = int(signal.getsignal(signal.SIGQUIT))  # 0: SIG_DFL, 1: SIG_IGN
signal.signal(signal.SIGQUIT, on)
signal.signal(signal.SIGTERM, on)
with open(sys.argv[1], "w") as out:
    out.write(f"{os.getpid()} {os.getppid()} {signal.getsignal(signal.SIGINT).__name__} {quit_at_start}")
try:
    time.sleep(30)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(7)
"""


@pytest.mark.parametrize("shell", SHELLS, ids=SHELL_IDS)
@pytest.mark.parametrize(("sent", "status", "said"), [(signal.SIGINT, 7, "KeyboardInterrupt"),
                                                      (signal.SIGQUIT, 9, "got SIGQUIT"),
                                                      (signal.SIGTERM, 42, "got SIGTERM")])
def test_the_signal_the_shell_gets_reaches_the_command_as_it_would_without_the_shell(tmp_path, shell, sent, status,
                                                                                     said):
    ready = tmp_path / "ready"
    process = start(shell, [PYTHON, script(tmp_path, "wait.py", WAITS_FOR_A_SIGNAL), str(ready)],
                    forwarder_env(tmp_path))
    pid, parent, on_int, on_quit = wait_for_file(ready, process).split()
    assert int(parent) == process.pid, "the command is the shell's own child"
    assert (on_int, on_quit) == ("default_int_handler", "0"), (
        "SIGINT and SIGQUIT as without the shell (an async command of sh starts with them ignored)")
    process.send_signal(sent)
    out, err = process.communicate(timeout=ENOUGH)
    assert process.returncode == status, err
    assert said in out.decode()


@pytest.mark.parametrize("shell", SHELLS, ids=SHELL_IDS)
@pytest.mark.parametrize(("sent", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGQUIT, 131)])
def test_a_signal_before_the_command_starts_means_it_never_starts(tmp_path, shell, sent, status):
    """The shell is stopped while it prepares (a slow `mkdir -p $CHECKPOINT_DIR`, held here until the
    signal was sent): the command is not started and the status is 128 + the signal's number."""
    env = forwarder_env(tmp_path, CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    ready, go, started = tmp_path / "mkdir-running", tmp_path / "go", tmp_path / "started"
    (tmp_path / "bin" / "mkdir").write_text(f"#!/bin/sh\necho yes > {ready}\nwhile [ ! -e {go} ]; do sleep 0.02; done\n"
                                            'exec /bin/mkdir "$@"\n')
    (tmp_path / "bin" / "mkdir").chmod(0o755)
    process = start(shell, ["touch", str(started)], env)
    wait_for_file(ready, process)
    process.send_signal(sent)
    time.sleep(0.2)  # (delivered: the shell is waiting for mkdir)
    go.touch()
    process.communicate(timeout=ENOUGH)
    assert process.returncode == status
    assert not started.exists()


@pytest.mark.parametrize("broken", [None, "python3", "python"])
def test_without_a_working_python_the_command_runs_as_before(tmp_path, broken):
    """No Python, a python3 that does not run, a `python` that is Python 2 (no -I): no exec helper."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("sh", "mkdir", "sleep", "cat"):
        (bare / tool).symlink_to(shutil.which(tool))
    if broken:
        (bare / broken).write_text('#!/bin/sh\necho "Unknown option: -I" >&2\nexit 2\n')
        (bare / broken).chmod(0o755)
    env = {"PATH": str(bare), "TMPDIR": str(tmp_path)}
    ran = subprocess.run([*DASH, "-c", read("forward-signals.sh"), "airflow-volcano-run", "sh", "-c", "exit 4"],
                         env=env, capture_output=True, timeout=ENOUGH)
    assert ran.returncode == 4, ran.stderr


@pytest.mark.parametrize("shell", SHELLS, ids=SHELL_IDS)
def test_the_exec_helper_keeps_the_environment_and_sh_s_exit_codes(tmp_path, shell):
    env = forwarder_env(tmp_path, ODD="it's $(x)\n")
    env.pop("LANG")  # the C locale: Python would set LC_CTYPE in its own environment (locale coercion)
    printed = subprocess.run([*shell, "-c", read("forward-signals.sh"), "airflow-volcano-run", "env", "-0"], env=env,
                             capture_output=True, timeout=ENOUGH)
    seen = dict(item.split(b"=", 1) for item in printed.stdout.split(b"\0") if item)
    assert seen.pop(b"ODD") == b"it's $(x)\n" and b"LC_CTYPE" not in seen, seen
    missing = subprocess.run([*shell, "-c", read("forward-signals.sh"), "airflow-volcano-run", "no-such-command"],
                             env=env, capture_output=True, text=True, timeout=ENOUGH)
    assert missing.returncode == 127 and "no-such-command: not found" in missing.stderr, missing.stderr
    plain = tmp_path / "plain.txt"
    plain.write_text("data\n")
    denied = subprocess.run([*shell, "-c", read("forward-signals.sh"), "airflow-volcano-run", str(plain)], env=env,
                            capture_output=True, text=True, timeout=ENOUGH)
    assert denied.returncode == 126, denied.stderr
    no_shebang = tmp_path / "job.sh"
    no_shebang.write_text("exit 5\n")
    no_shebang.chmod(0o755)
    as_sh = subprocess.run([*shell, "-c", read("forward-signals.sh"), "airflow-volcano-run", str(no_shebang)],
                           env=env, capture_output=True, timeout=ENOUGH)
    assert as_sh.returncode == 5, "a script without #! runs with sh, as sh itself would run it"


# The command starts a second process (a rank, say) and both wait for SIGINT.
# Each process says it is ready from inside its `try` (a SIGINT before it would end it with a traceback,
# not as the test expects): the rank marks that it sleeps, the main process says ready once it has.
TWO_WAIT_FOR_SIGINT = """\
import os, subprocess, sys, time
if sys.argv[1] == "rank":
    try:
        open(sys.argv[2] + ".sleeping", "w").close()
        time.sleep(30)
    except KeyboardInterrupt:
        open(sys.argv[2], "w").write("rank interrupted")
    sys.exit(0)
rank = subprocess.Popen([sys.executable, __file__, "rank", sys.argv[2]])
try:
    while not os.path.exists(sys.argv[2] + ".sleeping"):
        time.sleep(0.01)
    open(sys.argv[3], "w").write("ready")
    time.sleep(30)
except KeyboardInterrupt:
    rank.wait()
    sys.exit(7)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root (unshare)")
@pytest.mark.parametrize("shell", SHELLS, ids=SHELL_IDS)
def test_as_pid_1_a_sigint_reaches_every_process_of_the_container_as_sigint(tmp_path, shell):
    rank, ready = tmp_path / "rank", tmp_path / "ready"
    process = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *shell, "-c", read("forward-signals.sh"),
         "airflow-volcano-run", PYTHON, script(tmp_path, "two.py", TWO_WAIT_FOR_SIGINT), "main", str(rank), str(ready)],
        env=forwarder_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_file(ready, process)  # (and the rank is sleeping)
    deadline = time.monotonic() + ENOUGH
    while not (children := Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(int(children[0]), signal.SIGINT)  # the shell, PID 1 in its namespace
    _, err = process.communicate(timeout=ENOUGH)
    assert process.returncode == 7, err
    assert rank.read_text() == "rank interrupted"


def _pid_one(shell: list[str], tmp_path: Path, inject: int | None) -> tuple[int, str]:
    """The shell as PID 1 of a new pid namespace (as in a container), stall_timeout's watcher running,
    the command exiting 3 after 0.5 s; with `inject`, strace delivers SIGTERM to the shell at its
    `inject`-th wait4 call (the shell alone is traced: strace attaches before it execs)."""
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir(exist_ok=True)
    (podinfo / "annotations").write_text("")
    go = tmp_path / f"go-{inject}"
    os.mkfifo(go)
    env = forwarder_env(tmp_path, AIRFLOW_VOLCANO_PODINFO=str(podinfo), AIRFLOW_VOLCANO_SITECUSTOMIZE="",
                        FORWARDER=read("forward-signals.sh"), GO=str(go), SHELL_WORDS=" ".join(shell))
    # Blocks (no fork, so no wait4 of its own) opening a FIFO until strace is attached, then becomes the shell.
    outer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
         ': < "$GO"; exec $SHELL_WORDS -c "$FORWARDER" airflow-volcano-run '
         f'{PYTHON} -c "import time, sys; time.sleep(0.5); sys.exit(3)"'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + ENOUGH
    while not (children := Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    trace = tmp_path / f"strace-{inject}"
    injection = ["-e", f"inject=wait4:signal=TERM:when={inject}"] if inject else []
    tracer = subprocess.Popen(["strace", "-o", str(trace), "-e", "trace=wait4", *injection, "-p", children[0]],
                              stderr=subprocess.PIPE)
    while "Process" not in tracer.stderr.readline().decode():  # "Process N attached"
        pass
    with open(go, "w"):
        pass
    try:
        outer.communicate(timeout=ENOUGH)
    except subprocess.TimeoutExpired:  # say what each process of the namespace was doing
        states = {}
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            if f"\nPPid:\t{children[0]}\n" in text or status.parent.name == children[0]:
                states[status.parent.name] = [line for line in text.splitlines()
                                              if line.startswith(("Name", "State", "NSpid", "TracerPid", "SigPnd"))]
        outer.kill()
        raise AssertionError(f"inject={inject}: the shell did not end: {states}; {trace.read_text()}") from None
    finally:
        tracer.wait(timeout=ENOUGH)
    return outer.returncode, trace.read_text()


@pytest.mark.skipif(not shutil.which("strace") or os.geteuid() != 0, reason="needs strace and root (unshare)")
@pytest.mark.parametrize("shell", [shell for shell in SHELLS if shell[0] != "bash"],
                         ids=[name for name in SHELL_IDS if name != "bash"])
def test_a_sigterm_at_any_wait_of_pid_1_is_forwarded_or_comes_too_late_and_the_status_is_the_commands(
        tmp_path, shell):
    """Deterministic, with strace's fault injection: SIGTERM delivered at each of the shell's wait4
    calls in turn, those while it prepares, while the command runs, the one that reaps the command
    and those after. Before it reaped the command the status is 143 (the command, or the shell that
    never started it, got SIGTERM); from then on it is the command's own, 3. (Before this change a
    SIGTERM while it prepared was lost, the trap not yet installed: the command ran and exited 3.
    A SIGTERM after the reaping wait returned made the old loop wait again for the reaped child;
    dash and busybox kept its status here, but say 127 once another job has been started since.)"""
    status, trace = _pid_one(shell, tmp_path, None)
    assert status == 3, trace
    calls = [line for line in trace.splitlines() if line.startswith("wait4(")]
    reaping = next(index for index, line in enumerate(calls, 1) if "WEXITSTATUS(s) == 3" in line)
    for inject in range(1, reaping + 3):
        status, trace = _pid_one(shell, tmp_path, inject)
        assert status == (143 if inject < reaping else 3), (inject, reaping, trace)


# -- holding a non-retryable failure --------------------------------------------------------------------------


def timed(shell: list[str], command: list[str], env: dict[str, str]) -> tuple[int, float]:
    begun = time.monotonic()
    ran = subprocess.run([*shell, "-c", read("forward-signals.sh"), "airflow-volcano-run", *command], env=env,
                         capture_output=True, timeout=ENOUGH)
    return ran.returncode, time.monotonic() - begun


@pytest.mark.parametrize("shell", [shell for shell in SHELLS if shell[0] != "bash"],
                         ids=[name for name in SHELL_IDS if name != "bash"])  # (bash: the hold's end, below)
def test_a_non_retryable_exit_is_held_back_and_a_retryable_or_a_success_is_not(tmp_path, shell):
    # (Margins for a loaded 2-core machine: a run that is not held takes well under a second.)
    env = forwarder_env(tmp_path, AIRFLOW_VOLCANO_HOLD_EXIT="3 130 137 138 143")
    status, seconds = timed(shell, ["sh", "-c", "exit 1"], env)
    assert status == 1 and 3 <= seconds < 8, seconds
    for command, expected in ((["sh", "-c", "kill -KILL $$"], 137), (["sh", "-c", "exit 0"], 0),
                              (["sh", "-c", "exit 130"], 130)):
        status, seconds = timed(shell, command, env)
        assert status == expected and seconds < 2.5, (command, status, seconds)
    status, seconds = timed(shell, ["sh", "-c", "exit 1"], {**env, "AIRFLOW_VOLCANO_HOLD_EXIT": "3 1 137"})
    assert status == 1 and seconds < 2.5, "a listed code is not held"
    status, seconds = timed(shell, ["sh", "-c", "exit 1"], forwarder_env(tmp_path))
    assert status == 1 and seconds < 2.5, "no hold without the variable"


@pytest.mark.parametrize("shell", SHELLS, ids=SHELL_IDS)
def test_a_sigterm_during_the_hold_ends_it_at_once_with_the_commands_status(tmp_path, shell):
    marker = tmp_path / "exited"
    env = forwarder_env(tmp_path, AIRFLOW_VOLCANO_HOLD_EXIT="10 137")
    process = start(shell, ["sh", "-c", f"echo yes > {marker}; exit 1"], env)
    wait_for_file(marker, process)
    time.sleep(0.5)  # (now holding)
    assert process.poll() is None, "held"
    begun = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=ENOUGH)
    assert process.returncode == 1 and time.monotonic() - begun < 5


def test_a_command_stopped_by_a_signal_is_not_held(tmp_path):
    ready = tmp_path / "ready"
    env = forwarder_env(tmp_path, AIRFLOW_VOLCANO_HOLD_EXIT="10 137")
    process = start(DASH, [PYTHON, script(tmp_path, "wait.py", WAITS_FOR_A_SIGNAL), str(ready)], env)
    wait_for_file(ready, process)
    begun = time.monotonic()
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=ENOUGH)
    assert process.returncode == 7 and time.monotonic() - begun < 5, "exit 7 after a signal: not held"


# -- the output relay -----------------------------------------------------------------------------------------


def relay_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir(exist_ok=True)
    (podinfo / "annotations").touch()
    return forwarder_env(tmp_path, AIRFLOW_VOLCANO_PODINFO=str(podinfo),
                         AIRFLOW_VOLCANO_SITECUSTOMIZE=read("stack_dumps.py"),
                         AIRFLOW_VOLCANO_OUTPUT_RELAY=read("output_relay.py"), **extra)


# Writes bytes that are not text to stdout, then redraws a progress bar on stderr with `\r` and no
# newline at all for 11 s (the shell turns the relay's touches into a heartbeat line every 10 s).
PROGRESS = """\
import os, sys, time
os.write(1, bytes(range(256)) + b"no newline at the end")
begun, step = time.monotonic(), 0
while time.monotonic() - begun < 11:
    os.write(2, b"\\r%d%%|" % step + b"#" * (step % 50))
    step += 1
    time.sleep(0.1)
os.write(2, b"\\rdone %d" % step)
"""


def test_progress_without_a_newline_makes_heartbeats_and_its_bytes_come_through_with_a_newline_every_5s(tmp_path):
    ran = subprocess.run([*DASH, "-c", read("forward-signals.sh"), "airflow-volcano-run", PYTHON, "-c", PROGRESS],
                         env=relay_env(tmp_path), capture_output=True, timeout=ENOUGH + 10)
    assert ran.returncode == 0, ran.stderr
    heartbeat = b"[airflow-volcano] heartbeat\n"
    assert ran.stdout.startswith(bytes(range(256)) + b"no newline at the end")
    assert ran.stdout.count(heartbeat) >= 1 and ran.stdout.replace(heartbeat, b"") == \
        bytes(range(256)) + b"no newline at the end", "the command's bytes, exactly, and heartbeat lines"
    steps = int(re.search(rb"\rdone (\d+)\Z", ran.stderr).group(1))
    assert ran.stderr.replace(b"\n", b"") == b"".join(b"\r%d%%|" % step + b"#" * (step % 50)
                                                     for step in range(steps)) + b"\rdone %d" % steps, (
        "every redraw, in order, and only newlines added")
    # A bar redrawn for 11 s: its open line ended after a redraw every REDRAW_LINE_SECONDS (5 s), so the
    # container runtime puts its latest state in the log then, not one line of every redraw at the end.
    assert ran.stderr.count(b"\n") in (1, 2), ran.stderr.count(b"\n")
    assert all(re.fullmatch(rb"(\r\d+%\|#*)+", line) for line in ran.stderr.split(b"\n")[:-1]), (
        "each newline right after a whole redraw")


@pytest.mark.parametrize("shell", SHELLS, ids=SHELL_IDS)
@pytest.mark.parametrize(("command", "status"), [("print('ok')", 0), ("import sys; sys.exit(1)", 1),
                                                 ("import os; os.kill(os.getpid(), 9)", 137)])
def test_with_the_relay_the_exit_status_is_the_commands(tmp_path, shell, command, status):
    ran = subprocess.run([*shell, "-c", read("forward-signals.sh"), "airflow-volcano-run", PYTHON, "-c", command],
                         env=relay_env(tmp_path), capture_output=True, text=True, timeout=ENOUGH)
    assert ran.returncode == status, ran.stderr
    assert ran.stdout == ("ok\n" if status == 0 else "")


def test_a_reader_gone_from_the_relays_output_does_not_kill_the_command(tmp_path):
    """The relay's stdout is a pipe nobody reads any more (EPIPE): the command writes 4 MiB to it and
    still exits 0."""
    done = tmp_path / "done"
    command = f"import os\nfor _ in range(64):\n    os.write(1, b'x' * 65536)\nopen({str(done)!r}, 'w').close()\n"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        ran = subprocess.run([*DASH, "-c", read("forward-signals.sh"), "airflow-volcano-run", PYTHON, "-c", command],
                             env=relay_env(tmp_path), stdout=write_end, stderr=subprocess.PIPE, timeout=ENOUGH)
    finally:
        os.close(write_end)
    assert ran.returncode == 0, ran.stderr
    assert done.exists()


@pytest.mark.parametrize("shell", SHELLS, ids=SHELL_IDS)
def test_with_the_relay_a_sigterm_reaches_the_command_and_its_last_words_are_copied(tmp_path, shell):
    ready = tmp_path / "ready"
    process = start(shell, [PYTHON, script(tmp_path, "wait.py", WAITS_FOR_A_SIGNAL), str(ready)],
                    relay_env(tmp_path, AIRFLOW_VOLCANO_HOLD_EXIT="10 137"))
    wait_for_file(ready, process)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=ENOUGH)
    assert process.returncode == 42 and out.decode() == "got SIGTERM\n"


def test_a_process_left_holding_the_output_does_not_keep_the_shell(tmp_path):
    """The command leaves a background process writing to the same stdout: the shell still ends soon
    after the command (the relay copies what is there, then ends)."""
    command = "import subprocess, sys; subprocess.Popen(['sleep', '30']); print('bye', flush=True); sys.exit(2)"
    begun = time.monotonic()
    process = start(DASH, [PYTHON, "-c", command], relay_env(tmp_path))
    out, _ = process.communicate(timeout=ENOUGH)
    assert process.returncode == 2 and out == b"bye\n"
    assert time.monotonic() - begun < 8


# -- stacks ---------------------------------------------------------------------------------------------------

# A registered process that then runs another program in its place (`os.execvp`: its pid, no handler),
# and a registered one that sleeps (its stack is asked for), its arguments carrying a secret; it also
# catches signal 64, the top bit of the 64-bit SigCgt mask (parsed whole, it would overflow sh's $((...))).
STACKS_SCRIPT = """\
import os, signal, subprocess, sys, time
if sys.argv[1] == "exec":
    open(sys.argv[2], "w").write(str(os.getpid()))
    os.execvp("sh", ["sh", "-c", "sleep 600"])
subprocess.Popen([sys.executable, __file__, "exec", sys.argv[2]]); signal.signal(64, lambda *_: None)
time.sleep(600)
"""


@pytest.mark.parametrize("shell", [shell for shell in SHELLS if shell[0] != "bash"],
                         ids=[name for name in SHELL_IDS if name != "bash"])
def test_a_stacks_request_kills_no_process_that_cannot_answer_and_a_live_one_prints_its_stack(tmp_path, shell):
    env = relay_env(tmp_path, RANK="2", LOCAL_RANK="0")
    execd_pid = tmp_path / "execd"
    train = script(tmp_path, "train.py", STACKS_SCRIPT)
    # A pid a stale stacks file names: it catches signal 64 (the mask's top bit: dash would read a
    # whole 64-bit mask as INTMAX_MAX, every bit set), not 42.
    stranger = subprocess.Popen([PYTHON, "-I", "-c", "import signal, time\n"
                                 "signal.signal(64, lambda *_: None)\ntime.sleep(600)"])
    process = start(shell, [PYTHON, train, "main", str(execd_pid), "--token=hunter2"], env)
    stacks_dir, execd = tmp_path / "airflow-volcano", None
    try:
        execd = int(wait_for_file(execd_pid, process))
        deadline = time.monotonic() + ENOUGH
        while len(list(stacks_dir.glob("stacks-*"))) < 2:  # the script's and the exec'd child's
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # (the child has exec'd sh by now)
        (stacks_dir / f"stacks-{stranger.pid}").write_text("")
        (stacks_dir / f"about-{stranger.pid}").write_text("RANK=9: python old.py\n")
        (tmp_path / "podinfo" / "annotations").write_text('airflow-volcano.io/dump-stacks="1764000000"\n')
        deadline = time.monotonic() + ENOUGH
        # Its file is removed when the request is answered (or it was signalled, and ended).
        while (stacks_dir / f"stacks-{stranger.pid}").exists() and stranger.poll() is None:
            assert time.monotonic() < deadline, "never answered"
            time.sleep(0.1)
        time.sleep(2)  # (the answer is printed a second after the signal)
        assert stranger.poll() is None, "a pid that merely has a stale file is not signalled"
        os.kill(execd, 0)  # still there: the exec'd program was not signalled
        assert not (stacks_dir / f"stacks-{execd}").exists(), "its files are gone"
    finally:
        stranger.kill()
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=ENOUGH)
        children = Path(f"/proc/{execd}/task/{execd}/children")
        for pid in [*(children.read_text().split() if children.exists() else []), str(execd)]:  # sh, its sleep
            subprocess.run(["kill", "-9", pid], capture_output=True)
    lines = out.decode().splitlines()
    prefix = "[airflow-volcano] stacks 1764000000: "
    assert f"{prefix}begin" in lines and f"{prefix}end" in lines
    about = [line for line in lines if line.startswith(f"{prefix}process ")]
    assert about == [f"{prefix}process {process_pid(lines, prefix)}, RANK=2 LOCAL_RANK=0: {PYTHON} {train} "
                     "(+3 arguments)"], lines
    assert f'{prefix}  File "{train}", line 6 in <module>' in lines
    assert "hunter2" not in out.decode(), "no argument's value"


def process_pid(lines: list[str], prefix: str) -> str:
    return next(line for line in lines if line.startswith(f"{prefix}process ")).split()[4].rstrip(",")


def test_the_handler_is_registered_before_the_process_is_advertised(tmp_path):
    """forward-signals.sh signals the pids of the `stacks-<pid>` files: when the file appears, the
    handler must be in place (else signal 42 ends the process), and its `about-<pid>` already there."""
    import json

    import airflow_volcano.shell

    source = Path(airflow_volcano.shell.__file__).with_name("stack_dumps.py")
    probe = (
        "import faulthandler, json, os\n"
        "real = faulthandler.register\n"
        "def register(*args, **kwargs):\n"
        f"    print(json.dumps(sorted(os.listdir({str(tmp_path)!r}))))\n"
        "    real(*args, **kwargs)\n"
        "faulthandler.register = register\n"
        f"exec(compile(open({str(source)!r}).read(), 'stack_dumps.py', 'exec'), {{'__name__': 'stack_dumps'}})\n"
        f"print(json.dumps(sorted(os.listdir({str(tmp_path)!r}))), os.getpid())\n"
    )
    ran = subprocess.run([PYTHON, "-c", probe], env={**os.environ, "AIRFLOW_VOLCANO_STACKS_DIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=ENOUGH)
    before, after = ran.stdout.splitlines()
    after, pid = after.rsplit(" ", 1)
    assert f"about-{pid}" in json.loads(before) and f"stacks-{pid}" not in json.loads(before), (before, ran.stderr)
    assert json.loads(after) == [f"about-{pid}", f"stacks-{pid}"]
