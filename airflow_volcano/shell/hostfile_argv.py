"""airflow-volcano-argv.py: a training script's arguments, carried exactly to every rank of a hostfile launch.

Shipped unchanged in the script's ConfigMap beside airflow-volcano-launch.sh. DeepSpeed's runner hands
the script and its arguments to pdsh, which joins them into one command line that every worker's ssh
session runs with `sh -c` (there `$(...)`, a backtick, a quote or a newline in an argument is shell,
and an empty argument is lost), and logs that command line into the master's log (an argument may be
a secret). So the arguments never travel through a launcher:

- Every worker pod has the script's arguments as its own container args; its airflow-volcano-sshd.sh
  saves them at start, each ended by a NUL, to $AIRFLOW_VOLCANO_POD_ARGS_FILE (mode 600, readable in
  the pod only), and the ssh sessions restore the pod's environment, that variable included.
- On the master, airflow-volcano-launch.sh runs `python3 <this file> --launch [--launcher-options N
  OPTION...] SCRIPT`, and the launcher runs this file as the program of every rank::

      deepspeed --force_multi --hostfile=H --master_addr=A --master_port=P OPTION... <this file> SCRIPT
      mpirun --allow-run-as-root --hostfile H -np R -x MASTER_ADDR=A -x MASTER_PORT=P OPTION... \
          <python> <this file> SCRIPT

  The launcher, its port and the hostfile come from AIRFLOW_VOLCANO_LAUNCHER, AIRFLOW_VOLCANO_PORT
  and AIRFLOW_VOLCANO_HOSTFILE (A is the hostfile's first host, R the sum of its slots).
- On every rank (`<this file> [OPTION...] SCRIPT`, the OPTIONs being what the launcher inserts, such
  as deepspeed's `--local_rank=N`), the arguments are read from the worker's file and SCRIPT runs as
  `__main__` with sys.argv = [SCRIPT, OPTION..., ARG...], as `python SCRIPT OPTION... ARG...` would.

DeepSpeed's runner also writes `export NAME=value;` into that command line for its environment's
variables named MLFLOW*, PYTHON*, MV2*, UCX* (and NCCL* with CUDA): those it would only copy are
removed from its environment (each rank gets its pod's own values from the ssh session); the
PYTHON* interpreter settings it needs itself stay, and must be shell-inert, as must the master's
working directory, which it also writes there (`cd <dir>;`, PYTHONPATH=<dir>:...).

Standard library only, Python >= 3.8: it runs in the training image.
"""

from __future__ import annotations

import os
import re
import runpy
import sys

ARGS_FILE_ENV = "AIRFLOW_VOLCANO_POD_ARGS_FILE"
# What a shell takes literally in an unquoted word (DeepSpeed's own test for quoting an export, in ASCII).
INERT = re.compile(r"[A-Za-z0-9_@%+=:,./-]*\Z")
OPTIONS_FLAG = "--launcher-options"
COUNT = re.compile(r"[0-9]+\Z")
# DeepSpeed 0.19.8's runner.py EXPORT_ENVS are MLFLOW, PYTHON, MV2, UCX (matched as name prefixes),
# plus the accelerator's export_envs() (CUDA: NCCL; CPU: none); earlier releases also exported
# Nebula's and AzureML's names (deepspeed/nebula/constants.py NEBULA_EXPORT_ENVS).
COPIED_PREFIXES = ("MLFLOW", "MV2", "UCX", "NCCL", "DLTS_JOB_ID", "DLTS_NUM_WORKER", "NEBULA_", "AML_RUN_ID",
                   "AZUREML_", "FC_TASKROLE_NAME", "FC_TASK_INDEX", "MASTER_HOST", "LOCAL_HOST")
KEPT_PREFIXES = ("PYTHON",)  # the runner's own interpreter settings (PYTHONPATH, PYTHONUNBUFFERED, ...)


class LaunchError(Exception):
    """Arguments or an environment this file cannot carry exactly; the message says which."""


def read_arguments(path: str) -> list[str]:
    """The script's arguments as a worker's airflow-volcano-sshd.sh saved them (each ended by a NUL)."""
    with open(path, "rb") as saved:
        words = saved.read().split(b"\0")
    if words[-1]:
        raise LaunchError(f"{path}: not a file of NUL-ended arguments")
    return [os.fsdecode(word) for word in words[:-1]]


def split_launch_arguments(argv: list[str]) -> tuple[list[str], str, list[str]]:
    """airflow-volcano-launch.sh's arguments: (launcher options, script, anything after the script)."""
    options: list[str] = []
    if argv and argv[0] == OPTIONS_FLAG:
        if len(argv) < 2 or not COUNT.match(argv[1]) or len(argv) < 2 + int(argv[1]):
            raise LaunchError(f"{OPTIONS_FLAG} takes a count N and N options")
        count = int(argv[1])
        options, argv = argv[2:2 + count], argv[2 + count:]
    if not argv:
        raise LaunchError(f"usage: airflow-volcano-launch.sh [{OPTIONS_FLAG} N OPTION...] SCRIPT")
    return options, argv[0], argv[1:]


def read_hostfile(path: str) -> tuple[str, int]:
    """The first host of the hostfile the launch script wrote (`<host> slots=<n>` lines), and the ranks."""
    with open(path) as lines:
        hosts = [line.split() for line in lines if line.strip()]
    if not hosts:
        raise LaunchError(f"the hostfile {path} lists no worker")
    return hosts[0][0], sum(int(fields[1].split("=", 1)[1]) for fields in hosts)


def runner_environment(environ: dict[str, str], cwd: str) -> dict[str, str]:
    """DeepSpeed's runner's environment: without the variables it would only copy into the workers'
    command line; the PYTHON* ones it needs itself stay, and they and the working directory (which
    it changes to there with `cd`, and prepends to PYTHONPATH) must then be shell-inert."""
    if not INERT.match(cwd):
        raise LaunchError(f"the working directory {cwd!r} has characters DeepSpeed's runner would pass unquoted to "
                          "the workers' shell (it runs `cd <dir>` there); use letters, digits and _@%+=:,./-")
    kept = {}
    for name, value in environ.items():
        if name.startswith(COPIED_PREFIXES):
            continue
        if name.startswith(KEPT_PREFIXES) and not INERT.match(value):
            raise LaunchError(f"the value of {name} has characters DeepSpeed's runner would write unquoted into the "
                              "workers' shell command (export NAME=value); use letters, digits and _@%+=:,./-")
        kept[name] = value
    return kept


def launch(argv: list[str], environ: dict[str, str]) -> None:
    """Master: run the launcher with this file as each rank's program, which takes the script's
    arguments from its worker."""
    options, script, arguments = split_launch_arguments(argv)
    if arguments:
        raise LaunchError(f"{len(arguments)} argument(s) after the script: the ranks take the script's arguments from "
                          "their worker pods (args=), which saved them; the launch takes none")
    launcher = environ["AIRFLOW_VOLCANO_LAUNCHER"]
    port, hostfile = environ["AIRFLOW_VOLCANO_PORT"], environ["AIRFLOW_VOLCANO_HOSTFILE"]
    this = os.path.abspath(__file__)
    for path in (script, this):
        if not path.startswith("/") or not INERT.match(path):
            raise LaunchError(f"{path!r}: the launcher passes this path to the ranks as it is; give an absolute path "
                              "of letters, digits and _@%+=:,./-")
    first_host, ranks = read_hostfile(hostfile)
    program = [this, script]
    if launcher == "deepspeed":
        command = ["deepspeed", "--force_multi", f"--hostfile={hostfile}", f"--master_addr={first_host}",
                   f"--master_port={port}", *options, *program]
        env = runner_environment(environ, os.getcwd())
    elif launcher == "mpirun":
        command = ["mpirun", "--allow-run-as-root", "--hostfile", hostfile, "-np", str(ranks),
                   "-x", f"MASTER_ADDR={first_host}", "-x", f"MASTER_PORT={port}", *options, sys.executable, *program]
        env = dict(environ)
    else:
        raise LaunchError(f"AIRFLOW_VOLCANO_LAUNCHER must be deepspeed or mpirun, got {launcher!r}")
    print(f"airflow-volcano: {launcher} runs {script} on every rank through {os.path.basename(this)}, with the "
          "arguments its worker pod saved", flush=True)
    os.execvpe(command[0], command, env)


def run_rank(argv: list[str], environ: dict[str, str]) -> None:
    """A rank: run the script as `python SCRIPT ...` would, with its worker's saved arguments."""
    inserted: list[str] = []
    while argv and argv[0].startswith("-"):  # the launcher's own, e.g. deepspeed's --local_rank=N
        inserted.append(argv.pop(0))
    if len(argv) != 1:
        raise LaunchError("expected the launcher's options, then the script alone (its arguments come from the "
                          f"worker's {ARGS_FILE_ENV}), got {len(argv)} word(s) from the script on")
    if not environ.get(ARGS_FILE_ENV):
        raise LaunchError(f"{ARGS_FILE_ENV} is not set: run by a hostfile launch, on a worker whose "
                          "airflow-volcano-sshd.sh saved the script's arguments")
    script, arguments = argv[0], read_arguments(environ[ARGS_FILE_ENV])
    sys.argv = [script, *inserted, *arguments]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def main(argv: list[str]) -> None:
    try:
        if argv[:1] == ["--launch"]:
            launch(argv[1:], dict(os.environ))
        else:
            run_rank(list(argv), dict(os.environ))
    except (LaunchError, OSError) as error:
        sys.exit(f"airflow-volcano: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
