"""docker-compose.yaml's Airflow services as real processes, with no Docker: each service's `command` and
`environment`, read from the compose file, run from this repository's venv against a private PostgreSQL
from Debian, in the order its `depends_on` gives, each waited for with its own `healthcheck`. Only what
must differ outside containers is mapped: service host names and ports (free ports on 127.0.0.1), the
mounts (the dags folder, the kubeconfig, the logs volume) and AIRFLOW_HOME.

Used by tests/integration/test_compose_services.py (a user's path through the UI) and by
benchmarks/chaos_soak.py (hundreds of task instances under faults).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from tests import compose

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# What the host needs, as in scripts/volcano_cluster.py: (the file that shows it is there, its Debian package).
# The font: the seed's training script prints Chinese, which the screenshot should show as text.
HOST_TOOLS = [("/usr/lib/postgresql", "postgresql"), (str(CHROMIUM), "chromium"), ("/usr/bin/curl", "curl"),
              ("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc", "fonts-wqy-microhei")]


def ensure_debian_packages() -> None:
    wanted = sorted({package for path, package in HOST_TOOLS if not Path(path).exists()})
    if wanted:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *wanted], check=True, env=env)


def postgres_bin() -> Path:
    """The newest PostgreSQL Debian installed (its server binaries are not on PATH)."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    assert versions, "Debian's postgresql package installs no server"
    return versions[-1].parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Secrets:
    """Values never to print: the compose file's secrets and the generated password."""

    values: list[str] = field(default_factory=list)

    def redact(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, "***")
        return text


def tail(path: Path, secrets: Secrets, lines: int = 60) -> str:
    if not path.exists():
        return f"({path} missing)"
    return secrets.redact("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))


# ---------------------------------------------------------------------------------------------
# PostgreSQL: the `postgres` service as the official image sets it up (POSTGRES_USER is the
# superuser, with POSTGRES_PASSWORD; POSTGRES_DB is created), on a free port of 127.0.0.1.
# ---------------------------------------------------------------------------------------------


@dataclass
class Postgres:
    port: int
    directory: Path
    process: subprocess.Popen
    bin: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:  # backends left by a killed postmaster
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(self.directory, ignore_errors=True)


def as_postgres(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """Root cannot run PostgreSQL's server tools: they run as the `postgres` user."""
    return subprocess.run(argv, user="postgres", group="postgres", extra_groups=[], capture_output=True, text=True,
                          **kwargs)


def start_postgres(service: dict[str, Any]) -> Postgres:
    env = compose.environment(service)
    user, password, database = env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]
    pg = postgres_bin()
    # Not under pytest's tmp_path: that is root's alone, and the server runs as `postgres`.
    directory = Path(tempfile.mkdtemp(prefix="compose-postgres-"))
    shutil.chown(directory, "postgres", "postgres")
    password_file = directory / "password"
    password_file.write_text(password)
    shutil.chown(password_file, "postgres", "postgres")
    password_file.chmod(0o600)
    init = as_postgres([str(pg / "initdb"), "-D", str(directory / "data"), "-U", user, f"--pwfile={password_file}",
                        "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-sync"])
    password_file.unlink()
    if init.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise AssertionError(f"initdb failed:\n{init.stdout}\n{init.stderr}")
    port = free_port()
    with (directory / "postgres.log").open("ab") as log:
        process = subprocess.Popen(
            [str(pg / "postgres"), "-D", str(directory / "data"), "-p", str(port), "-k", str(directory),
             "-c", "listen_addresses=127.0.0.1"],
            user="postgres", group="postgres", extra_groups=[], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    server = Postgres(port, directory, process, pg)
    try:
        wait_until("PostgreSQL to accept connections on its socket", lambda: as_postgres(
            [str(pg / "pg_isready"), "-h", str(directory), "-p", str(port)]).returncode == 0, timeout=60,
            failed=lambda: process.poll() is not None)
        created = as_postgres([str(pg / "createdb"), "-h", str(directory), "-p", str(port), "-U", user, database])
        assert created.returncode == 0, created.stderr
    except BaseException:
        server.stop()
        raise
    return server


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5,
               failed: Callable[[], bool] = lambda: False) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if failed():
            raise AssertionError(f"gave up waiting for {what}: it failed")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# ---------------------------------------------------------------------------------------------
# The Airflow services
# ---------------------------------------------------------------------------------------------


@dataclass
class Host:
    """Where the compose file's names point outside containers."""

    home: Path  # AIRFLOW_HOME
    addresses: dict[str, str]  # "service:port" or "localhost:port" in the file -> "127.0.0.1:port" here
    paths: dict[str, str]  # container path outside AIRFLOW_HOME -> host path
    extra_env: dict[str, str]  # ports of Airflow's own listeners, which the file leaves at their defaults

    def map(self, value: str) -> str:
        for address, here in self.addresses.items():  # in URLs only: after // or user@
            value = re.sub(rf"(?<=[/@]){re.escape(address)}(?!\d)", here, value)
        for container_path, host_path in self.paths.items():
            value = value.replace(container_path, host_path)
        return value

    def environment(self, service: dict[str, Any]) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
        env.update({key: self.map(value) for key, value in compose.environment(service).items()})
        # The image puts airflow on PATH and runs Python unbuffered; the venv stands in for the image.
        env.update(self.extra_env, AIRFLOW_HOME=str(self.home), PATH=f"{VENV_BIN}:{env.get('PATH', '')}",
                   PYTHONUNBUFFERED="1")
        return env


def mount(service: dict[str, Any], host: Host) -> None:
    """A service's volumes, here: a bind mount under AIRFLOW_HOME is a symlink, a named volume a
    directory of the Airflow home (shared by every service, as the volume is), and a bind mount
    elsewhere (the kubeconfig) is its host path, put in place of the container path by Host.map."""
    for volume in compose.volumes(service):
        if not volume.target.startswith(compose.IMAGE_AIRFLOW_HOME + "/"):
            assert volume.type == "bind", volume
            assert Path(volume.source).exists(), f"{volume.source} is missing (bind.create_host_path is false)"
            host.paths[volume.target] = volume.source
            continue
        here = host.home / volume.target.removeprefix(compose.IMAGE_AIRFLOW_HOME + "/")
        if here.exists() or here.is_symlink():
            continue
        if volume.type == "bind":
            here.symlink_to(volume.source, target_is_directory=True)
        else:
            here.mkdir(parents=True)


def healthcheck_argv(test: list[str], pg: Path) -> list[str]:
    kind, *argv = test
    if kind == "CMD-SHELL":
        return ["sh", "-c", *argv]
    assert kind == "CMD", test
    if argv[0] == "airflow":
        return [str(VENV_BIN / "airflow"), *argv[1:]]
    if argv[0] == "pg_isready":
        return [str(pg / "pg_isready"), *argv[1:]]
    return argv


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log: Path
    output: IO[bytes]  # the log file, open for the process

    def stop(self) -> None:
        """SIGTERM as `docker compose stop` sends it; then whatever the service started (task
        processes, log servers) goes with its process group."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.output.close()


@dataclass
class Stack:
    spec: dict[str, Any]
    host: Host
    api: str  # base URL of the api-server
    secrets: Secrets
    services: dict[str, Service]
    postgres: Postgres

    def kill(self, name: str) -> int:
        """kill -9 a service and what it started (a crashed container), as `docker kill` would; returns its pid."""
        service = self.services[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.process.pid, signal.SIGKILL)
        service.process.wait()
        service.output.close()
        return service.process.pid

    def start(self, name: str) -> None:
        """Start a service that is not running (Compose's `restart: always` after a crash)."""
        assert self.services[name].process.poll() is not None, f"{name} is running"
        self.services[name] = launch(self.spec, self.host, name)

    def logs(self) -> str:
        return "\n".join(f"--- {name} ({service.log}):\n{tail(service.log, self.secrets)}"
                         for name, service in self.services.items())


def launch(spec: dict[str, Any], host: Host, name: str) -> Service:
    """Start one service's command, its output appended to `<AIRFLOW_HOME>/<name>.log`."""
    service = spec["services"][name]
    log = host.home / f"{name}.log"
    output = log.open("ab")
    process = subprocess.Popen([str(VENV_BIN / "airflow"), *compose.command(service)],
                               env=host.environment(service), cwd=host.home, stdout=output,
                               stderr=subprocess.STDOUT, start_new_session=True)
    return Service(name, process, log, output)


def start_services(spec: dict[str, Any], host: Host, pg: Path, secrets: Secrets, started: dict[str, Service],
                   healthy_before: set[str]) -> None:
    """Start the Airflow services as Compose would: each once its `depends_on` conditions hold
    (service_healthy: its healthcheck passes; service_completed_successfully: it exited 0)."""
    names = compose.airflow_services(spec)
    healthy, completed = set(healthy_before), set()

    def ready(name: str) -> bool:
        for dependency, how in (spec["services"][name].get("depends_on") or {}).items():
            condition = how["condition"]
            if condition == "service_healthy" and dependency not in healthy:
                return False
            if condition == "service_completed_successfully" and dependency not in completed:
                return False
            if condition == "service_started" and dependency not in started and dependency not in healthy:
                return False
        return True

    def healthcheck(name: str) -> bool:
        test = spec["services"][name].get("healthcheck", {}).get("test")
        if test is None:
            return True
        argv = [host.map(part) for part in healthcheck_argv(test, pg)]
        env = host.environment(spec["services"][name])
        return subprocess.run(argv, env=env, capture_output=True, timeout=120).returncode == 0

    deadline = time.monotonic() + 240
    while set(names) - healthy - completed:
        for name in names:
            if name not in started and ready(name):
                started[name] = launch(spec, host, name)
        for name, service in started.items():
            if name in healthy or name in completed:
                continue
            code = service.process.poll()
            if "restart" not in spec["services"][name] and code is not None:  # a one-shot
                assert code == 0, f"{name} exited {code}:\n{tail(service.log, secrets)}"
                completed.add(name)
            elif code is not None:
                raise AssertionError(f"{name} exited {code}:\n{tail(service.log, secrets)}")
            elif "restart" in spec["services"][name] and healthcheck(name):
                healthy.add(name)
        assert time.monotonic() < deadline, (
            f"not healthy: {sorted(set(names) - healthy - completed)}\n"
            + "\n".join(f"--- {n}:\n{tail(s.log, secrets, 30)}" for n, s in started.items()))
        time.sleep(1)


POLICY = '''\
"""Written by tests/compose_stack.py: the example DAGs' training runs on the
local cluster's real node (its selector and toleration, the local image, small requests), as
scripts/demo.py does, without editing the DAGs."""

from __future__ import annotations

import json

PLACEMENT = json.loads({placement!r})
RESOURCES = json.loads({resources!r})


def task_policy(task) -> None:
    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    if isinstance(task, VolcanoPyTorchJobOperator):
        task.image, task.image_pull_policy = PLACEMENT["image"], PLACEMENT["image_pull_policy"]
        task.node_selector, task.tolerations = PLACEMENT["node_selector"], PLACEMENT["tolerations"]
        task.container_resources = RESOURCES
'''


@contextlib.contextmanager
def compose_stack(kubeconfig: Path, home: Path, *, policy: str = "", variables: Mapping[str, str] | None = None,
                  extra_env: Mapping[str, str] | None = None) -> Iterator[Stack]:
    """The compose services with AIRFLOW_HOME `home`; `policy` is its config/airflow_local_settings.py,
    `variables` more of the compose file's variables, `extra_env` settings every service gets (what a user
    would add to the file's common environment)."""
    ensure_debian_packages()
    secrets = Secrets()
    variables = {
        "AIRFLOW_UID": str(os.getuid()),
        "AIRFLOW_JWT_SECRET": os.urandom(32).hex(),
        "AIRFLOW_API_SECRET_KEY": os.urandom(32).hex(),
        "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "KUBECONFIG_PATH": str(kubeconfig),
        **(variables or {}),
    }
    secrets.values += [variables[k] for k in ("AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY", "AIRFLOW_FERNET_KEY")]
    spec = compose.load(variables)

    (home / "config").mkdir(parents=True)
    (home / "config" / "airflow_local_settings.py").write_text(policy)

    from airflow.configuration import conf

    api_container_port = int(spec["services"]["api-server"]["ports"][0].rsplit(":", 1)[1])
    health_container_port = conf.get_default_value("scheduler", "scheduler_health_check_server_port")
    api_port, health_port = free_port(), free_port()
    postgres = start_postgres(spec["services"]["postgres"])
    host = Host(
        home=home,
        addresses={"postgres:5432": f"127.0.0.1:{postgres.port}",
                   f"api-server:{api_container_port}": f"127.0.0.1:{api_port}",
                   f"localhost:{api_container_port}": f"127.0.0.1:{api_port}",
                   f"localhost:{health_container_port}": f"127.0.0.1:{health_port}"},
        paths={},
        extra_env={"AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(api_port),
                   "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
                   "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(health_port),
                   "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                   "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                   **(extra_env or {})},
    )
    services: dict[str, Service] = {}
    try:
        # The postgres service's own healthcheck, over TCP as the Airflow services connect.
        pg_check = healthcheck_argv(spec["services"]["postgres"]["healthcheck"]["test"], postgres.bin)
        wait_until("the postgres service's healthcheck", lambda: subprocess.run(
            [*pg_check, "-h", "127.0.0.1", "-p", str(postgres.port)], capture_output=True).returncode == 0, timeout=30)
        for name in compose.airflow_services(spec):
            mount(spec["services"][name], host)
        start_services(spec, host, postgres.bin, secrets, services, healthy_before={"postgres"})
        yield Stack(spec, host, f"http://127.0.0.1:{api_port}", secrets, services, postgres)
    finally:
        for service in reversed(list(services.values())):
            service.stop()
        postgres.stop()


def login(stack: Stack) -> tuple[str, str]:
    """The first configured user and the password the api-server generated for it, from the file a
    user reads (`docker compose exec api-server cat simple_auth_manager_passwords.json.generated`)."""
    users = compose.environment(stack.spec["services"]["api-server"])["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    username = users.split(",")[0].split(":")[0]
    passwords = json.loads((stack.host.home / "simple_auth_manager_passwords.json.generated").read_text())
    stack.secrets.values.append(passwords[username])
    return username, passwords[username]


@contextlib.contextmanager
def signed_in(stack: Stack, username: str, password: str) -> Iterator[httpx.Client]:
    """A client of the REST API with the user's token, as a script of theirs would call it."""
    with httpx.Client(base_url=stack.api, timeout=60) as http:
        response = http.post("/auth/token", json={"username": username, "password": password})
        assert response.status_code == 201, response.text
        http.headers["Authorization"] = f"Bearer {response.json()['access_token']}"
        stack.secrets.values.append(response.json()["access_token"])
        yield http


def unpause(http: httpx.Client, dag_id: str) -> None:
    """The dag-processor parses dags/ (the mounted folder) and the DAG appears, paused; unpause it."""
    dag = wait_until(f"the dag-processor to parse {dag_id}", lambda: (
        r := http.get(f"/api/v2/dags/{dag_id}")).status_code == 200 and r.json(), timeout=120)
    assert dag["is_paused"] is True, "DAGS_ARE_PAUSED_AT_CREATION"
    assert http.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}).status_code == 200

