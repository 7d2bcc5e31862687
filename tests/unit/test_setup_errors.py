"""A setup mistake gets one clear line (issue 44): an apiserver that does not answer is named with the
Airflow connection and its server, after the retry policy's attempts, as the provider's own error;
urllib3 does not retry (and warn) under the hook's own retries. Against a real closed port on this
machine, through both hooks."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_volcano.exceptions import ApiserverUnreachable, KubernetesConnectionError, VolcanoApiError
from airflow_volcano.hooks import calls
from airflow_volcano.hooks.retry import short, unreachable_cause
from airflow_volcano.hooks.volcano import AsyncVolcanoHook, VolcanoHook

from ..log_lines import Lines


@pytest.fixture
def closed_port() -> int:
    """A port on this machine nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def connection_to(server: str, conn_id: str, tmp_path: Path, monkeypatch) -> None:
    """Airflow connection `conn_id`: a kubeconfig naming `server`, with a token."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "a-token-never-shown"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}))


@pytest.fixture
def unreachable_connection(tmp_path: Path, closed_port: int, monkeypatch) -> str:
    connection_to(f"https://127.0.0.1:{closed_port}", "training_cluster", tmp_path, monkeypatch)
    monkeypatch.setattr("time.sleep", lambda seconds: None)  # the back-off's waits, not its attempts
    return f"https://127.0.0.1:{closed_port}"


def test_the_sync_hook_names_the_connection_and_its_server_in_one_line(unreachable_connection):
    hook = VolcanoHook("training_cluster", retries=2)
    said = Lines()
    hook._log = logging.getLogger("test_setup_errors.hook")  # a stdlib logger in place of Airflow's, to read it
    loggers = (hook._log, logging.getLogger("urllib3"))
    for logger in loggers:
        logger.addHandler(said)
        logger.setLevel(logging.DEBUG)
    try:
        with pytest.raises(ApiserverUnreachable) as raised:
            hook.list_jobs("ml", "app=x")
    finally:
        for logger in loggers:
            logger.removeHandler(said)
    message = str(raised.value)
    assert message.startswith("list Jobs in ml failed: no answer from the Kubernetes apiserver "
                              f"{unreachable_connection} of Airflow connection 'training_cluster' (Connection refused")
    assert "\n" not in message and "a-token-never-shown" not in message
    assert isinstance(raised.value, VolcanoApiError) and raised.value.status == 0, "the provider's API error"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__, "no chained client traceback"
    warnings = said.at_least(logging.WARNING)
    assert not [line for line in warnings if "Retrying" in line], "urllib3 retries nothing under the hook's retries"
    assert warnings == [f"list Jobs in ml failed (no answer: Connection refused); retrying in {delay}"
                        for delay in [warning.rsplit(" ", 1)[1] for warning in warnings]]
    assert len(warnings) == 2, "the hook's own retries, each said once"


def test_the_async_hook_says_the_same(unreachable_connection, monkeypatch):
    async def no_wait(seconds: float) -> None:
        return None

    monkeypatch.setattr("asyncio.sleep", no_wait)

    async def read() -> None:
        await AsyncVolcanoHook("training_cluster", retries=1).run(calls.get_job("train", "ml"))

    with pytest.raises(ApiserverUnreachable) as raised:
        asyncio.run(read())
    assert f"no answer from the Kubernetes apiserver {unreachable_connection} of Airflow connection " \
           "'training_cluster'" in str(raised.value)
    assert "Connect call failed" in raised.value.cause or "Connection refused" in raised.value.cause


def test_the_cause_is_the_sockets_own_reason_at_any_depth(closed_port):
    import urllib3

    pool = urllib3.PoolManager(retries=urllib3.Retry(total=0))
    with pytest.raises(urllib3.exceptions.MaxRetryError) as failed:
        pool.request("GET", f"http://127.0.0.1:{closed_port}/")
    assert unreachable_cause(failed.value) == "Connection refused"
    assert short(failed.value) == "no answer: Connection refused"
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = failed.value
    assert unreachable_cause(wrapped) == "Connection refused"


@pytest.fixture
def kubeconfig_naming_missing_files(tmp_path: Path, monkeypatch) -> str:
    """A kubeconfig as minikube writes it (certificate files by path), read where those files are not:
    in a container that mounts only the kubeconfig (docker-compose.yaml)."""
    missing = tmp_path / "not-mounted" / "ca.crt"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                               "certificate-authority": str(missing)}}],
        "users": [{"name": "u", "user": {"client-certificate": str(missing.with_name("client.crt")),
                                         "client-key": str(missing.with_name("client.key"))}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    monkeypatch.setenv("AIRFLOW_CONN_MINIKUBE", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}))
    return str(missing)


def test_a_kubeconfig_naming_a_file_that_is_not_here_is_said_naming_the_connection(kubeconfig_naming_missing_files):
    with pytest.raises(KubernetesConnectionError) as raised:
        VolcanoHook("minikube").list_jobs("ml", "app=x")
    message = str(raised.value)
    assert message.startswith("Airflow connection 'minikube' could not be loaded: File does not exist: "
                              f"{kubeconfig_naming_missing_files}")
    assert "kubectl config view --flatten --minify" in message and raised.value.__cause__ is None

    async def read() -> None:
        await AsyncVolcanoHook("minikube").run(calls.get_job("train", "ml"))

    with pytest.raises(KubernetesConnectionError, match="Airflow connection 'minikube' could not be loaded: File "
                                                        "does not exist"):
        asyncio.run(read())


def test_the_preflight_says_it_in_one_line(kubeconfig_naming_missing_files):
    from airflow_volcano.preflight import main

    lines: list[str] = []
    assert main(["--conn-id", "minikube", "--namespace", "ml"], out=lines.append) == 1
    assert len(lines) == 1 and lines[0].startswith("FAIL  connection: Airflow connection 'minikube' could not be "
                                                   "loaded: File does not exist:"), lines


@pytest.fixture
def silent_connection(tmp_path: Path, monkeypatch) -> Iterator[str]:
    """An apiserver address whose port takes connections (the kernel completes them) and never answers:
    a proxy holding them, a half-open connection. The request timeout shortened to a second."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        server = f"https://127.0.0.1:{silent.getsockname()[1]}"
        connection_to(server, "silent_cluster", tmp_path, monkeypatch)
        monkeypatch.setattr(calls, "REQUEST_TIMEOUT", (1, 1))
        yield server


def ended_within(seconds: float, read: Callable[[], object]) -> BaseException:
    """What `read` raised, if it ended within `seconds` (a thread: without a timeout it never ends)."""
    raised: list[BaseException] = []

    def attempt() -> None:
        try:
            read()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            raised.append(error)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the call still waited after {seconds} s on a connection that never answers"
    assert raised, "a call to a silent apiserver succeeded"
    return raised[0]


def test_a_call_to_an_apiserver_that_never_answers_ends_as_the_providers_error(silent_connection):
    error = ended_within(30, lambda: VolcanoHook("silent_cluster", retries=0).get_job("train", "ml"))
    assert isinstance(error, ApiserverUnreachable), repr(error)
    assert f"no answer from the Kubernetes apiserver {silent_connection} of Airflow connection 'silent_cluster'" \
        in str(error)
    assert "timed out" in str(error), str(error)


def test_the_async_hook_does_not_wait_for_it_for_good_either(silent_connection):
    async def read() -> None:
        await AsyncVolcanoHook("silent_cluster", retries=0).run(calls.get_job("train", "ml"))

    error = ended_within(30, lambda: asyncio.run(read()))
    assert isinstance(error, ApiserverUnreachable), repr(error)
    assert f"no answer from the Kubernetes apiserver {silent_connection}" in str(error)


def test_only_a_followed_log_may_be_silent_for_long():
    assert calls.get_job("train", "ml").sent_kwargs["_request_timeout"] == calls.REQUEST_TIMEOUT
    followed = calls.read_pod_log("train-master-0", "ml", container=None, follow=True)
    assert followed.sent_kwargs["_request_timeout"] == (10, None), "its connection bounded, not its silences"
    assert calls.read_pod_log("train-master-0", "ml", container=None).sent_kwargs["_request_timeout"] == \
        calls.REQUEST_TIMEOUT


@pytest.fixture
def answerless_server() -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP server on loopback that reads every request and answers none: an apiserver gone silent
    behind a proxy that still takes requests. Gives its address and the request lines it read."""
    requests: list[bytes] = []
    held: list[socket.socket] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            held.append(connection)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := connection.recv(65536)):
                data += chunk
            requests.append(data.split(b"\r\n", 1)[0])

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", requests
    listener.close()
    for connection in held:
        connection.close()


def test_a_read_that_timed_out_is_asked_again_only_by_the_hooks_own_retries(answerless_server, tmp_path,
                                                                             monkeypatch):
    """urllib3 asked a silent apiserver three more times by itself, each a full read timeout (60 s):
    a GET held 4 minutes before the hook's policy could retry it, or say anything."""
    server, requests = answerless_server
    connection_to(server, "silent_cluster", tmp_path, monkeypatch)
    monkeypatch.setattr(calls, "REQUEST_TIMEOUT", (1, 0.5))
    monkeypatch.setattr("time.sleep", lambda seconds: None)  # the back-off's waits, not its attempts
    error = ended_within(30, lambda: VolcanoHook("silent_cluster", retries=2).get_job("train", "ml"))
    assert isinstance(error, ApiserverUnreachable), repr(error)
    assert "(timed out; tried for " in str(error), str(error)
    assert requests == [b"GET /apis/batch.volcano.sh/v1alpha1/namespaces/ml/jobs/train HTTP/1.1"] * 3, \
        "each of the hook's three attempts asked once"
