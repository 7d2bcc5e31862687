"""`sitecustomize` of every Python process in a training container when stall_timeout is set.

forward-signals.sh writes this file into a directory of its own and puts that directory first on
PYTHONPATH (exporting it as AIRFLOW_VOLCANO_STACKS_DIR too); each Python process (the script, torchrun's agent
and every local rank it starts) then registers Python's `faulthandler` on STACKS_SIGNAL. The handler
is C code: it writes the stack of every thread even while the main thread is blocked inside a
collective, without the script doing anything. When the operator sees a stall, forward-signals.sh
sends the signal to the processes registered here and prints what they wrote.

It runs before the user's code in every Python process of the container: it must never fail
(everything is guarded) and must not hide the image's own sitecustomize (imported after it).
Python 3.6 syntax at most: it runs under whatever Python the image has.
"""

import os
import sys

# A real-time signal: nothing else in a training container uses it (SIGUSR1/2 are often a script's
# own), and it is the same number under glibc (SIGRTMIN 34) and musl (35). Unhandled, it would end a
# process: forward-signals.sh sends it only to the processes registered here.
STACKS_SIGNAL = 42


def _register(directory: str) -> None:
    import faulthandler

    pid = os.getpid()
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            command = " ".join(cmdline.read().replace(b"\0", b" ").decode("utf-8", "replace").split())  # one line
    except OSError:
        command = " ".join(sys.argv)
    ranks = " ".join(f"{name}={os.environ[name]}" for name in ("RANK", "LOCAL_RANK") if name in os.environ)
    with open(os.path.join(directory, f"about-{pid}"), "w") as about:
        about.write(f"{ranks or 'no RANK'}: {command[:300]}\n")
    # Appended to (O_APPEND): forward-signals.sh empties the file after printing it.
    stacks = open(os.path.join(directory, f"stacks-{pid}"), "a")  # noqa: SIM115 - the handler writes to it
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    sys.__dict__["_airflow_volcano_stacks"] = stacks  # kept open as long as the process lives


def _import_the_images_own() -> None:
    """The sitecustomize this one shadows, if the image has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    ourselves = sys.modules.pop(__name__, None)
    try:
        import sitecustomize  # noqa: F401 - imported for its effects
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if ourselves is not None:  # the import system expects a module under this name when we return
            sys.modules.setdefault(__name__, ourselves)


try:
    # Where forward-signals.sh wrote this file: it looks for the registrations there. (Not read from
    # the environment: a launcher over ssh, DeepSpeed's, passes PYTHONPATH on but not our variables.)
    _register(os.environ.get("AIRFLOW_VOLCANO_STACKS_DIR") or os.path.dirname(os.path.abspath(__file__)))
except Exception:  # noqa: BLE001, S110 - no stacks on a stall is better than a script that cannot start
    pass
if __name__ == "sitecustomize":
    _import_the_images_own()
