"""The DeepSpeed/mpirun launch (VolcanoDeepSpeedJobOperator): the pods' scripts are the package's files,
every value reaches them from their container's environment, and the script's arguments reach every
rank exactly, through no launcher. The scripts really run here, with `sh`, on stand-ins for ssh, sshd
and the launchers (the DeepSpeed one builds the command line each worker's ssh session runs as DeepSpeed
0.19.8's runner does); tests/integration/test_real_launch_args.py runs the real ones."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_volcano.constants import SCRIPT_MOUNT_PATH
from airflow_volcano.hostfile_launch import (
    ARGV_SHIM,
    LAUNCH_SCRIPT,
    PACKAGE_FILES,
    SESSION_SCRIPT,
    SSHD_SCRIPT,
    HostfileLaunch,
)
from airflow_volcano.kubelet import process_string
from airflow_volcano.manifest import TrainingScript
from airflow_volcano.shell import read
from airflow_volcano.shell.hostfile_argv import read_arguments

from .test_manifest import build, container, error_of

SHELL_DIR = Path(__file__).resolve().parents[2] / "airflow_volcano" / "shell"
# Writes what its rank received; a marker file proves no shell ran `$(...)` or a backtick on the way.
TRAIN = """\
import json, os, sys
with open(os.environ["ARGV_OUT"], "a") as out:
    out.write(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0]}) + "\\n")
"""
HOSTILE = ["$(id)", "`id`", "it's \"quoted\"", "a\nb", "", "--opt=$(id)", "--opt2=$HOME", "naïve ✓ 训练", "-", "--",
           " lead", "trail ", "*", "~", "\t", "x", "xAA", "--local_rank=7", "$(HF_TOKEN)", "a;b|c&d>e", "\\", "'"]


def env_of(item: dict) -> dict[str, str]:
    """A container's environment as its process gets it (the kubelet turns `$$` into `$`)."""
    return {entry["name"]: process_string(entry["value"]) for entry in item.get("env") or []}


def deepspeed_job(**kwargs):
    kwargs.setdefault("worker_replicas", 2)
    kwargs.setdefault("training_script", TrainingScript("train.py", TRAIN))
    return build(**kwargs)


# -- the ConfigMap and the containers ---------------------------------------------------------------------


def test_the_configmap_holds_the_package_files_byte_for_byte_whatever_the_options():
    small = deepspeed_job(hostfile_launch=HostfileLaunch()).configmap["data"]
    other = deepspeed_job(worker_replicas=3, worker_task_name="gpu", hostfile_launch=HostfileLaunch(
        launcher="mpirun", slots_per_worker=4, port=29700, ssh_wait_timeout=9, options=["--mca", "btl", "tcp"]),
    ).configmap["data"]
    assert set(small) == {"train.py", LAUNCH_SCRIPT, SSHD_SCRIPT, SESSION_SCRIPT, ARGV_SHIM}
    for name, source in PACKAGE_FILES.items():
        assert small[name].encode() == (SHELL_DIR / source).read_bytes(), name
        assert other[name] == small[name], f"{name}: no value is written into a script"


def test_the_master_and_the_workers_take_every_setting_from_their_environment():
    job = deepspeed_job(worker_task_name="gpu-workers", args=["--steps", "5"], env={"AIRFLOW_VOLCANO_PORT": "1"},
                        hostfile_launch=HostfileLaunch(slots_per_worker="2", port="29600", ssh_wait_timeout=60,
                                                       options=["--bind_cores_to_rank", "--comment=$(id) `id`"])).job
    master, workers = container(job, "master"), container(job, "gpu-workers")
    assert {key: value for key, value in env_of(master).items() if key.startswith("AIRFLOW_VOLCANO_")} == {
        "AIRFLOW_VOLCANO_LAUNCHER": "deepspeed",
        "AIRFLOW_VOLCANO_SLOTS_PER_WORKER": "2",
        "AIRFLOW_VOLCANO_PORT": "29600",  # the operator's own win over a user's variable of the same name
        "AIRFLOW_VOLCANO_SSH_WAIT_TIMEOUT": "60",
        "AIRFLOW_VOLCANO_WORKER_HOSTS_FILE": "/etc/volcano/gpu-workers.host",
        "AIRFLOW_VOLCANO_HOSTFILE": "/tmp/airflow-volcano-hostfile",
        "AIRFLOW_VOLCANO_SSH_CLIENT_CONFIG": "/etc/ssh/ssh_config.d/airflow-volcano.conf",
        "AIRFLOW_VOLCANO_TERMINATION_LOG": "/dev/termination-log",
        "AIRFLOW_VOLCANO_ARGV_SHIM": f"{SCRIPT_MOUNT_PATH}/{ARGV_SHIM}",
    }
    assert [item["name"] for item in master["env"]].count("AIRFLOW_VOLCANO_PORT") == 1
    # The launcher options travel counted, one word each, as given (the kubelet expands nothing in them).
    assert [process_string(word) for word in master["command"]] == [
        "/bin/sh", f"{SCRIPT_MOUNT_PATH}/{LAUNCH_SCRIPT}", "--launcher-options", "2", "--bind_cores_to_rank",
        "--comment=$(id) `id`", f"{SCRIPT_MOUNT_PATH}/train.py"]
    # The arguments stay with the workers, whose ranks read them there: no launcher carries them.
    assert "args" not in master and workers["args"] == ["--steps", "5"]
    assert workers["command"] == ["/bin/sh", f"{SCRIPT_MOUNT_PATH}/{SSHD_SCRIPT}"]
    assert env_of(workers).items() >= {
        "AIRFLOW_VOLCANO_POD_ENV_FILE": "/run/airflow-volcano-pod-env",
        "AIRFLOW_VOLCANO_POD_ARGS_FILE": "/run/airflow-volcano-pod-args",
        "AIRFLOW_VOLCANO_SSH_SESSION_SCRIPT": f"{SCRIPT_MOUNT_PATH}/{SESSION_SCRIPT}"}.items()
    assert env_of(master)["PYTHONUNBUFFERED"] == env_of(workers)["PYTHONUNBUFFERED"] == "1"


@pytest.mark.parametrize(("options", "expected"), [
    (["--module"], "launcher_options: '--module' cannot be used: the ranks run training_script as a Python file"),
    (["--no_py"], "'--no_py' cannot be used"),
    (["--autotuning=run"], "'--autotuning=run' cannot be used"),
    (["--venv_script=/v/bin/activate; id"], "DeepSpeed's runner writes this value unquoted"),
    (["--enable_each_rank_log", "/logs/$(id)"], "DeepSpeed's runner writes this value unquoted"),
    (["--enable_each=/logs/`id`"], "DeepSpeed's runner writes this value unquoted"),
])
def test_deepspeed_flags_that_would_bypass_the_argument_encoding_are_refused(options, expected):
    assert expected in error_of(worker_replicas=1, training_script=TrainingScript("train.py", TRAIN),
                                hostfile_launch=HostfileLaunch(options=options))


def test_inert_deepspeed_flag_values_and_mpirun_options_pass():
    for launcher, options in (("deepspeed", ["--venv_script", "/venv/bin/activate", "--enable_each_rank_log=/logs"]),
                              ("mpirun", ["--module", "--venv_script=$(id)"])):
        job = deepspeed_job(hostfile_launch=HostfileLaunch(launcher=launcher, options=options)).job
        assert [process_string(word) for word in container(job, "master")["command"][4:-1]] == options


# -- the saved arguments ------------------------------------------------------------------------------------


def save_arguments(tmp_path: Path, arguments: list[str]) -> Path:
    """The worker's sshd script, run as its container runs it (sshd and the host tools stand-ins), with
    `arguments` as the container's args: returns the file it saved them to."""
    stubs = tmp_path / "sshd-bin"
    stubs.mkdir(exist_ok=True)
    for tool in ("sshd", "ssh-keygen", "mkdir"):
        executable(stubs / tool, "#!/bin/sh\n")
    saved = tmp_path / "pod-args"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "AIRFLOW_VOLCANO_POD_ENV_FILE": str(tmp_path / "pod-env"),
           "AIRFLOW_VOLCANO_POD_ARGS_FILE": str(saved), "AIRFLOW_VOLCANO_SSH_SESSION_SCRIPT": "/opt/s.sh"}
    ran = subprocess.run(["/bin/sh", str(SHELL_DIR / PACKAGE_FILES[SSHD_SCRIPT]), *arguments], capture_output=True,
                         env=env, timeout=30)
    assert ran.returncode == 0, ran.stderr
    return saved


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)))))
def test_any_arguments_saved_by_the_workers_sshd_script_read_back_exactly(tmp_path_factory, arguments):
    saved = save_arguments(tmp_path_factory.mktemp("args"), arguments)
    assert read_arguments(str(saved)) == arguments
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600, "the pod's root only: an argument may be a secret"


def test_a_rank_runs_the_script_as_main_with_the_launchers_own_options_first(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN + "sys.exit(int(os.environ.get('EXIT_WITH', '0')))\n")
    out = tmp_path / "argv.jsonl"
    shim = str(SHELL_DIR / "hostfile_argv.py")
    env = {**os.environ, "ARGV_OUT": str(out), "EXIT_WITH": "7",
           "AIRFLOW_VOLCANO_POD_ARGS_FILE": str(save_arguments(tmp_path, HOSTILE))}
    ran = subprocess.run([sys.executable, shim, "--local_rank=3", str(script)], env=env, capture_output=True, text=True,
                         cwd=tmp_path)
    assert ran.returncode == 7, ran.stderr
    assert json.loads(out.read_text()) == {"argv": [str(script), "--local_rank=3", *HOSTILE], "name": "__main__",
                                           "path0": str(tmp_path)}
    extra = subprocess.run([sys.executable, shim, str(script), "--lr"], env=env, capture_output=True, text=True)
    assert extra.returncode == 1 and "then the script alone" in extra.stderr
    unset = subprocess.run([sys.executable, shim, str(script)], capture_output=True, text=True,
                           env={**env, "AIRFLOW_VOLCANO_POD_ARGS_FILE": ""})
    assert unset.returncode == 1 and "AIRFLOW_VOLCANO_POD_ARGS_FILE is not set" in unset.stderr


# -- the launch script, run with sh --------------------------------------------------------------------------


# DeepSpeed 0.19.8's runner with its pdsh launcher, reduced to what reaches a worker: its environment's
# MLFLOW/PYTHON/MV2/UCX (and CUDA's NCCL) variables as `export NAME=value;` (add_export: double quotes
# when a value has a character outside [\w@%+=:,./-]), `cd <cwd>;`, the python command of
# deepspeed.launcher.launch (here the rank's own command, with the --local_rank=N it adds), and the user
# arguments, double-quoted when they hold a space (PDSHRunner.parse_user_args), joined by spaces into one
# command line that the worker's ssh session (airflow-volcano-ssh-session.sh, as sshd runs it) runs.
DEEPSPEED_STUB = """\
import json, os, re, subprocess, sys
argv = sys.argv[1:]
with open(os.environ["STUB_RECORD"], "w") as record:
    json.dump({"argv": argv, "env": dict(os.environ)}, record)
index = 0
while argv[index].startswith("-"):
    index += 1
user_script, user_args = argv[index], argv[index + 1:]
env = dict(os.environ)
env["PYTHONPATH"] = os.path.abspath(".") + (":" + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
exports = ""
for name, value in env.items():
    if name.startswith(("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")):
        value = value.strip()
        if re.search(r'[^\\w@%+=:,./-]', value):
            value = f'"{value}"'
        exports += f"export {name}={value}; "
user_args = ['"{}"'.format(arg.replace('"', '\\\\"')) if " " in arg else arg for arg in user_args]
for worker in range(2):
    line = " ".join([exports, f"cd {os.path.abspath('.')};", sys.executable, "-u", user_script,
                     f"--local_rank={worker}", *user_args])
    session = {"SSH_ORIGINAL_COMMAND": line, "PATH": "/usr/bin:/bin"}  # sshd's environment, not the runner's
    if subprocess.call(["/bin/sh", os.environ["STUB_SESSION"], os.environ["STUB_POD_ENV"]], env=session):
        sys.exit(1)
"""
# OpenMPI's mpirun: its own options, then the program, which its daemons (started in a worker's ssh
# session) start on every slot, with the session's environment and the -x variables (no shell).
MPIRUN_STUB = """\
import json, os, shlex, subprocess, sys
argv = sys.argv[1:]
with open(os.environ["STUB_RECORD"], "w") as record:
    json.dump({"argv": argv, "env": dict(os.environ)}, record)
program = next(i for i, word in enumerate(argv) if word.endswith("airflow-volcano-argv.py")) - 1
for rank in range(int(argv[argv.index("-np") + 1])):
    session = {"SSH_ORIGINAL_COMMAND": f"OMPI_COMM_WORLD_RANK={rank} exec " + shlex.join(argv[program:]),
               "PATH": "/usr/bin:/bin"}
    if subprocess.call(["/bin/sh", os.environ["STUB_SESSION"], os.environ["STUB_POD_ENV"]], env=session):
        sys.exit(1)
"""
SSH_STUB = """\
#!/bin/sh
# ssh: every worker accepts a login (unless SSH_STUB_REFUSE); rank 0's termination message is "cat" there.
[ -z "${SSH_STUB_REFUSE:-}" ] || exit 255
for word; do last_but_one=${previous:-}; previous=$word; done
# SSH_STUB_CAT_FAILS: a file counting the reads of the termination message that fail first (a loaded node).
if [ "$last_but_one" = cat ] && [ -n "${SSH_STUB_CAT_FAILS:-}" ] && [ "$(cat "$SSH_STUB_CAT_FAILS")" -gt 0 ]; then
    echo $(($(cat "$SSH_STUB_CAT_FAILS") - 1)) > "$SSH_STUB_CAT_FAILS"
    exit 255
fi
[ "$last_but_one" != cat ] || printf '%s' '{"loss": 0.1}'
"""


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_launch(tmp_path: Path, manifests, extra_env: dict[str, str] | None = None,
               hosts: str = "j-worker-0.j\nj-worker-1.j", cwd: Path | None = None,
               ) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the master's command, from the ConfigMap's files, as its container would (its env and
    command+args as the kubelet gives them), with system paths moved under tmp_path, after a worker's
    sshd script saved its pod's environment and arguments (its own env and args) for the ranks'
    sessions. The svc plugin's hosts file (no newline at its end, as Volcano writes it) keeps its name."""
    mount, stubs = tmp_path / "script", tmp_path / "bin"
    for directory in (mount, stubs, tmp_path / "work"):
        directory.mkdir(exist_ok=True)
    for name, text in manifests.configmap["data"].items():
        (mount / name).write_text(text)
    executable(stubs / "deepspeed", f"#!{sys.executable}\n{DEEPSPEED_STUB}")
    executable(stubs / "mpirun", f"#!{sys.executable}\n{MPIRUN_STUB}")
    executable(stubs / "ssh", SSH_STUB)
    (stubs / "python3").symlink_to(sys.executable)
    worker = next(container(manifests.job, each["name"]) for each in manifests.job["spec"]["tasks"]
                  if each["name"] != "master")
    sshd_stubs = tmp_path / "sshd-bin"
    sshd_stubs.mkdir(exist_ok=True)
    for tool in ("sshd", "ssh-keygen", "mkdir"):
        executable(sshd_stubs / tool, "#!/bin/sh\n")
    pod_env, pod_args = tmp_path / "pod-env", tmp_path / "pod-args"
    saved = subprocess.run(
        [process_string(word).replace(SCRIPT_MOUNT_PATH, str(mount)) for word in [*worker["command"],
                                                                                 *(worker.get("args") or [])]],
        env={**env_of(worker), "PATH": f"{sshd_stubs}:{stubs}:/usr/bin:/bin", "HOME": str(tmp_path),
             "LANG": "C.UTF-8", "ARGV_OUT": str(tmp_path / "argv.jsonl"), "AIRFLOW_VOLCANO_POD_ENV_FILE": str(pod_env),
             "AIRFLOW_VOLCANO_POD_ARGS_FILE": str(pod_args), **(extra_env or {})},
        capture_output=True, text=True, timeout=30)
    assert saved.returncode == 0, saved.stderr
    master = container(manifests.job, "master")
    hosts_file = tmp_path / Path(env_of(master)["AIRFLOW_VOLCANO_WORKER_HOSTS_FILE"]).name
    hosts_file.write_text(hosts)
    env = {**env_of(master),
           "PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "AIRFLOW_VOLCANO_WORKER_HOSTS_FILE": str(hosts_file),
           "AIRFLOW_VOLCANO_HOSTFILE": str(tmp_path / "hostfile"),
           "AIRFLOW_VOLCANO_SSH_CLIENT_CONFIG": str(tmp_path / "ssh" / "ssh_config.d" / "airflow-volcano.conf"),
           "AIRFLOW_VOLCANO_TERMINATION_LOG": str(tmp_path / "termination-log"),
           "AIRFLOW_VOLCANO_ARGV_SHIM": str(mount / ARGV_SHIM),
           "STUB_RECORD": str(tmp_path / "launcher.json"), "STUB_SESSION": str(mount / SESSION_SCRIPT),
           "STUB_POD_ENV": str(pod_env), **(extra_env or {})}
    words = [process_string(word).replace(SCRIPT_MOUNT_PATH, str(mount))
             for word in [*master["command"], *(master.get("args") or [])]]
    ran = subprocess.run(words, env=env, capture_output=True, text=True, cwd=cwd or tmp_path / "work", timeout=60)
    return ran, mount


def ranks(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]


def launcher_record(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "launcher.json").read_text())


@pytest.mark.parametrize("launcher", ["deepspeed", "mpirun"])
def test_every_rank_gets_the_arguments_exactly_and_no_shell_runs_them(tmp_path, launcher):
    pwned = tmp_path / "pwned"
    hostile = [*HOSTILE, f"$(touch {pwned})", f"`touch {pwned}`", f"\"; touch {pwned}; echo \"",
               f"--o=$(touch {pwned})"]
    manifests = deepspeed_job(args=hostile, hostfile_launch=HostfileLaunch(launcher=launcher, slots_per_worker=2))
    ran, mount = run_launch(tmp_path, manifests)

    assert ran.returncode == 0, ran.stderr
    script = str(mount / "train.py")
    # The DeepSpeed stand-in starts one rank on each worker (with the --local_rank launch.py adds), mpirun all 4.
    expected = [[script, f"--local_rank={worker}", *hostile] for worker in range(2)] if launcher == "deepspeed" \
        else [[script, *hostile]] * 4
    assert [(rank["argv"], rank["name"]) for rank in ranks(tmp_path)] == [(argv, "__main__") for argv in expected]
    assert not pwned.exists(), "no shell ran an argument"
    record = json.dumps(launcher_record(tmp_path))
    assert not [arg for arg in hostile if len(arg) > 2 and json.dumps(arg)[1:-1] in record], \
        "no argument in the launcher's command line or environment (DeepSpeed's runner logs its command line)"
    assert (tmp_path / "hostfile").read_text() == "j-worker-0.j slots=2\nj-worker-1.j slots=2\n"
    assert "airflow-volcano: j-worker-0.j accepts ssh\nairflow-volcano: j-worker-1.j accepts ssh\n" in ran.stdout
    assert "2 workers x 2 slots = 4 ranks" in ran.stdout
    assert (tmp_path / "termination-log").read_text() == '{"loss": 0.1}', "rank 0's result is the master's"
    assert (tmp_path / "ssh" / "ssh_config.d" / "airflow-volcano.conf").read_text() == "LogLevel ERROR\n"
    program = [str(mount / ARGV_SHIM), script]  # no argument: the ranks read them from their worker
    if launcher == "deepspeed":
        assert launcher_record(tmp_path)["argv"] == [
            "--force_multi", f"--hostfile={tmp_path}/hostfile", "--master_addr=j-worker-0.j", "--master_port=29500",
            *program]
    else:
        assert launcher_record(tmp_path)["argv"] == [
            "--allow-run-as-root", "--hostfile", f"{tmp_path}/hostfile", "-np", "4", "-x", "MASTER_ADDR=j-worker-0.j",
            "-x", "MASTER_PORT=29500", str(tmp_path / "bin" / "python3"), *program]


@pytest.mark.parametrize(("launcher", "options"), [
    ("deepspeed", ["--comment=it's $(id) `id`", "--bind_cores_to_rank", "--launcher_args=-R ssh"]),
    ("mpirun", ["--tag", "it's a \"quoted\" $(value)", "--x=`id`", "", "--mca", "btl", "tcp,self"]),
])
def test_launcher_options_reach_the_launcher_as_the_words_given(tmp_path, launcher, options):
    manifests = deepspeed_job(args=["--steps", "5"], hostfile_launch=HostfileLaunch(
        launcher=launcher, options=options, port="29600"))
    ran, mount = run_launch(tmp_path, manifests)

    assert ran.returncode == 0, ran.stderr
    argv = launcher_record(tmp_path)["argv"]
    shim = argv.index(str(mount / ARGV_SHIM))
    before = argv[shim - len(options):shim] if launcher == "deepspeed" else argv[shim - 1 - len(options):shim - 1]
    assert before == options
    assert "--master_port=29600" in argv or "MASTER_PORT=29600" in argv


def test_deepspeeds_runner_gets_no_variable_it_would_only_copy_into_the_workers_command(tmp_path):
    pwned = tmp_path / "pwned"
    copied = {"MLFLOW_RUN_NOTE": f"`touch {pwned}`", "NCCL_SOCKET_IFNAME": f"$(touch {pwned})",
              "UCX_TLS": "tcp", "MV2_X": "1", "AZUREML_RUN_TOKEN": "secret"}
    manifests = deepspeed_job(hostfile_launch=HostfileLaunch())
    ran, _ = run_launch(tmp_path, manifests, extra_env={**copied, "PYTHONPATH": "/opt/lib:/srv/code",
                                                        "PYTHONHASHSEED": "0"})

    assert ran.returncode == 0, ran.stderr
    env = launcher_record(tmp_path)["env"]
    assert not set(copied) & set(env), "each rank gets these from its own pod (the ssh session restores it)"
    assert (env["PYTHONPATH"], env["PYTHONUNBUFFERED"], env["PYTHONHASHSEED"]) == ("/opt/lib:/srv/code", "1", "0")
    assert not pwned.exists()


@pytest.mark.parametrize(("extra_env", "cwd", "expected"), [
    ({"PYTHONSTARTUP": "/my dir/start.py"}, None, "the value of PYTHONSTARTUP has characters DeepSpeed's runner"),
    ({"PYTHONPATH": "/code:$(id)"}, None, "the value of PYTHONPATH has characters"),
    ({}, "odd dir $x", "the working directory"),
])
def test_deepspeed_refuses_to_launch_what_its_runner_would_hand_to_a_shell(tmp_path, extra_env, cwd, expected):
    manifests = deepspeed_job(hostfile_launch=HostfileLaunch())
    if cwd:
        (tmp_path / cwd).mkdir()
    ran, _ = run_launch(tmp_path, manifests, extra_env=extra_env, cwd=tmp_path / cwd if cwd else None)

    assert ran.returncode == 1 and expected in ran.stderr, ran.stderr
    assert not (tmp_path / "launcher.json").exists(), "the launcher never started"


def test_the_master_fails_naming_the_worker_whose_sshd_never_answered(tmp_path):
    manifests = deepspeed_job(hostfile_launch=HostfileLaunch(ssh_wait_timeout=1))
    ran, _ = run_launch(tmp_path, manifests, extra_env={"SSH_STUB_REFUSE": "1"})

    assert ran.returncode == 1
    assert ("airflow-volcano: worker j-worker-0.j did not accept an ssh login within 1s (ssh_wait_timeout)"
            in ran.stderr), ran.stderr


def test_a_missing_hosts_file_names_the_worker_task(tmp_path):
    manifests = deepspeed_job(worker_task_name="gpu", hostfile_launch=HostfileLaunch())
    ran, _ = run_launch(tmp_path, manifests, hosts="")

    assert ran.returncode == 1
    assert (f"airflow-volcano: {tmp_path}/gpu.host is missing or empty: the Job needs the svc plugin and a task "
            "named 'gpu' with at least one replica") in ran.stderr, ran.stderr


# -- the workers' sshd -------------------------------------------------------------------------------------


@pytest.mark.parametrize("openssh_has_penalties", [True, False], ids=["openssh-9.8+", "older-openssh"])
def test_sshd_allows_root_only_with_a_key_and_every_session_gets_the_pods_environment(tmp_path,
                                                                                     openssh_has_penalties):
    manifests = deepspeed_job(hostfile_launch=HostfileLaunch())
    mount, stubs = tmp_path / "script", tmp_path / "bin"
    mount.mkdir()
    stubs.mkdir()
    for name, text in manifests.configmap["data"].items():
        (mount / name).write_text(text)
    # sshd, ssh-keygen and mkdir (of /run/sshd) stand in: record, change nothing on this machine. `sshd -T`
    # checks an option as OpenSSH does: one it does not know is refused.
    executable(stubs / "sshd", f"#!{sys.executable}\nimport json, os, sys\n"
                               f"if '-T' in sys.argv: sys.exit(0 if {openssh_has_penalties} else 255)\n"
                               "json.dump(sys.argv[1:], open(os.environ['STUB_RECORD'], 'w'))\n")
    executable(stubs / "ssh-keygen", "#!/bin/sh\n")
    executable(stubs / "mkdir", "#!/bin/sh\n")
    env_file, tag = tmp_path / "pod-env", "it's \"nightly\"\n$(id) `id` $HOME"
    worker = env_of(container(manifests.job, "worker"))
    env = {**worker, "PATH": f"{stubs}:/usr/bin:/bin", "RUN_TAG": tag, "STUB_RECORD": str(tmp_path / "sshd.json"),
           "AIRFLOW_VOLCANO_POD_ENV_FILE": str(env_file), "AIRFLOW_VOLCANO_POD_ARGS_FILE": str(tmp_path / "args"),
           "AIRFLOW_VOLCANO_SSH_SESSION_SCRIPT": str(mount / SESSION_SCRIPT)}
    command = [word.replace(SCRIPT_MOUNT_PATH, str(mount)) for word in container(manifests.job, "worker")["command"]]
    ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)

    assert ran.returncode == 0, ran.stderr
    argv = json.loads((tmp_path / "sshd.json").read_text())
    assert argv[:2] == ["-D", "-e"] and argv[2::2] == ["-o"] * len(argv[3::2])
    settings = dict(option.split("=", 1) for option in argv[3::2])
    assert settings == {
        "PermitRootLogin": "prohibit-password", "PubkeyAuthentication": "yes", "AuthenticationMethods": "publickey",
        "PasswordAuthentication": "no", "PermitEmptyPasswords": "no", "ChallengeResponseAuthentication": "no",
        "AllowTcpForwarding": "no", "AllowStreamLocalForwarding": "no", "AllowAgentForwarding": "no",
        "X11Forwarding": "no", "PermitTunnel": "no", "PermitUserEnvironment": "no",
        "ForceCommand": f"/bin/sh {mount / SESSION_SCRIPT} {env_file}",
        # The master's hang-ups while it waits for sshd must not get it refused (OpenSSH 9.8+ only).
        **({"PerSourcePenalties": "no"} if openssh_has_penalties else {})}
    assert stat.S_IMODE(env_file.stat().st_mode) == stat.S_IMODE((tmp_path / "args").stat().st_mode) == 0o600
    # A session, as sshd runs it: its own bare environment, ForceCommand through the login shell.
    session = subprocess.run(["/bin/sh", "-c", settings["ForceCommand"]], capture_output=True, text=True,
                             env={"SSH_ORIGINAL_COMMAND": 'printf %s "$RUN_TAG"', "PATH": "/usr/bin:/bin"})
    assert session.returncode == 0 and session.stdout == tag, session


def test_sshd_refuses_paths_its_forcecommand_cannot_carry(tmp_path):
    script = SHELL_DIR / PACKAGE_FILES[SSHD_SCRIPT]
    ran = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True, env={
        "PATH": "/usr/bin:/bin", "AIRFLOW_VOLCANO_POD_ENV_FILE": f"{tmp_path}/pod env",
        "AIRFLOW_VOLCANO_POD_ARGS_FILE": f"{tmp_path}/args", "AIRFLOW_VOLCANO_SSH_SESSION_SCRIPT": "/opt/s.sh"})
    assert ran.returncode == 1 and "must be an absolute path of letters, digits and _./-" in ran.stderr
    assert not (tmp_path / "pod env").exists()


def test_the_scripts_are_valid_sh():
    for source in PACKAGE_FILES.values():
        if source.endswith(".sh"):
            checked = subprocess.run(["sh", "-n", str(SHELL_DIR / source)], capture_output=True, text=True)
            assert checked.returncode == 0, (source, checked.stderr)


# A rank's progress bar: bytes without a newline for 1.5 s, then its exit status.
PROGRESS = """\
import os, time
begun = time.monotonic()
while time.monotonic() - begun < 1.5:
    os.write(2, b"\\r%.1f s" % (time.monotonic() - begun))
    time.sleep(0.1)
os.write(1, bytes(range(256)))
raise SystemExit(3)
"""


@pytest.mark.parametrize("relay", [True, False])
def test_a_session_runs_its_command_through_the_workers_output_relay_when_it_prepared_one(tmp_path, relay):
    """The worker's forward-signals.sh (stall_timeout) wrote output_relay.py into its stacks directory,
    which the saved pod environment names: a rank's bytes come through unchanged and touch the worker's
    heartbeat file. Without it, the command runs as before."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    if relay:
        (stacks / "output_relay.py").write_text(read("output_relay.py"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env_file = tmp_path / "pod-env"
    saved = subprocess.run(["/bin/sh", "-c", f"export -p > {env_file}"], capture_output=True, env={
        "PATH": f"{bin_dir}:/usr/bin:/bin", "AIRFLOW_VOLCANO_STACKS_DIR": str(stacks),
        "HEARTBEAT_FILE": str(stacks / "heartbeat")})
    assert saved.returncode == 0
    session = subprocess.run(["/bin/sh", str(SHELL_DIR / PACKAGE_FILES[SESSION_SCRIPT]), str(env_file)],
                             capture_output=True, timeout=30, env={
                                 "SSH_ORIGINAL_COMMAND": f"python3 -c '{PROGRESS}'", "PATH": "/usr/bin:/bin"})
    assert session.returncode == 3, session.stderr
    assert session.stdout == bytes(range(256)) and session.stderr.startswith(b"\r0.0 s\r0.1 s")
    assert (stacks / "heartbeat").exists() is relay
    assert sorted(path.name for path in stacks.iterdir()) == (["heartbeat", "output_relay.py"] if relay else []), \
        "the session's FIFOs are removed"


@pytest.mark.parametrize(("failures", "copied"), [(2, True), (3, False)])
def test_rank_0s_result_is_copied_through_failed_logins_or_the_log_says_it_is_lost(tmp_path, failures, copied):
    """A login that fails once or twice (a loaded node) does not lose the task's result; a third says so."""
    counter = tmp_path / "cat-failures"
    counter.write_text(str(failures))
    ran, _ = run_launch(tmp_path, deepspeed_job(hostfile_launch=HostfileLaunch(launcher="deepspeed")),
                        {"SSH_STUB_CAT_FAILS": str(counter)})

    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "termination-log").read_text() == ('{"loss": 0.1}' if copied else "")
    assert ("could not read rank 0's termination message" in ran.stderr) is not copied, ran.stderr
