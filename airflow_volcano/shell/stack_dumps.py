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


def describe(argv: list) -> str:
    """A Python command line without its arguments, whose values may be secrets: the program, the
    script or module, and how many arguments follow (`python /opt/train.py (+3 arguments)`)."""
    if not argv:
        return "?"
    shown, index = [argv[0]], 1
    while index < len(argv):
        word = argv[index]
        index += 1
        if word == "--check-hash-based-pycs":  # the one long option with a value
            index += 1
        elif word == "--":
            shown += argv[index:index + 1]
            index += 1
            break
        elif word == "-" or not word.startswith("-"):
            shown.append(word)  # the script (`-`: stdin)
            break
        elif not word.startswith("--"):
            letters = word[1:]
            for position, letter in enumerate(letters):
                if letter not in "cmWX":  # -c CODE, -m MODULE, -W ARG, -X OPT take a value
                    continue
                attached = letters[position + 1:]
                if not attached:
                    index += 1
                if letter == "m":
                    shown += ["-m", attached or (argv[index - 1] if index <= len(argv) else "")]
                elif letter == "c":
                    shown.append("-c")
                break
            if shown[-1] == "-c" or len(shown) > 1 and shown[-2] == "-m":
                break
    count = max(0, len(argv) - index)
    return " ".join(shown) + (f" (+{count} argument{'' if count == 1 else 's'})" if count else "")


def _register(directory: str) -> None:
    import faulthandler

    pid = os.getpid()
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            argv = [word.decode("utf-8", "replace") for word in cmdline.read().split(b"\0")[:-1]]
    except OSError:
        argv = [sys.executable]
    command = " ".join(describe(argv).split())  # one line
    ranks = " ".join(f"{name}={os.environ[name]}" for name in ("RANK", "LOCAL_RANK") if name in os.environ)
    with open(os.path.join(directory, f"about-{pid}"), "w") as about:
        about.write(f"{ranks or 'no RANK'}: {command[:300]}\n")
    # The handler first, then the file under the name forward-signals.sh looks for: it signals only
    # registered processes. Appended to (O_APPEND): forward-signals.sh empties it after printing it.
    temporary = os.path.join(directory, f"new-stacks-{pid}")
    stacks = open(temporary, "a")  # noqa: SIM115 - the handler writes to it
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    sys.__dict__["_airflow_volcano_stacks"] = stacks  # kept open as long as the process lives
    os.rename(temporary, os.path.join(directory, f"stacks-{pid}"))


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
