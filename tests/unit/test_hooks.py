"""The hooks: every API call described once (hooks.calls), carried out by the sync and the async hook
through the one retry policy (hooks.retry). Against fakes of the clients' transport (no cluster): the
generated client methods of `kubernetes_asyncio` run for real, only `call_api` answers as scripted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import certifi
import pytest
from kubernetes_asyncio import client as async_client
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.hooks import calls
from airflow_volcano.hooks.retry import short


def retry_policy_hook(conn_id: str, retries: int) -> Any:
    """What Attempts asks of a hook (its retries, log, connection and ConnectionLossAware's memory), without a
    cluster."""
    import logging

    from airflow_volcano.hooks.retry import ConnectionLossAware

    class Hook(ConnectionLossAware):
        log = logging.getLogger("test")
        retries = 0

    hook = Hook()
    hook.conn_id, hook.retries = conn_id, retries
    return hook


@pytest.mark.parametrize(("header", "backoff", "expected"), [
    ("3600", 0.5, 30.0), ("2", 0.5, 2.0), ("0", 1.5, 1.5), (None, 0.7, 0.7), ("soon", 0.4, 0.4), ("-5", 0.4, 0.4),
])
def test_retry_after_is_honoured_up_to_a_cap(header, backoff, expected):
    from airflow_volcano.hooks.retry import retry_delay

    class Throttled(Exception):
        headers = {"Retry-After": header} if header is not None else {}

    assert retry_delay(Throttled(), backoff) == expected


def test_both_hooks_follow_one_attempts_policy(monkeypatch):
    """Attempts: what either hook does after a failed API call (absent, read credentials again, wait, raise)."""

    from kubernetes.client.rest import ApiException
    from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

    from airflow_volcano.hooks.retry import ABSENT, REQUIRED, Attempts, ConnectionLossAware, Retry

    def error(kind: type, status: int, retry_after: str | None = None, names: str | None = None) -> Exception:
        failure = kind(status=status, reason="x")
        failure.headers = {"Retry-After": retry_after} if retry_after else {}
        failure.body = json.dumps({"message": "said the apiserver", "details": {"name": names} if names else {}})
        return failure

    for kind in (ApiException, AsyncApiException):
        # Each client's round in a process where the apiserver never was unavailable (the last round's 503
        # would have a 401 retried for a while: test_a_403_is_retried_only_just_after_...).
        monkeypatch.setattr(ConnectionLossAware, "_connection_lost_at", float("-inf"))
        attempts = Attempts(retry_policy_hook("never-accepted", 2), "get Job ml/a", if_absent=None)
        assert attempts.after(error(kind, 404, names="a")) is ABSENT, "the apiserver says the Job does not exist"
        with pytest.raises(VolcanoApiError, match="does not serve this resource") as unserved:
            Attempts(retry_policy_hook("never-accepted", 2), "get Job ml/a", if_absent=None).after(error(kind, 404))
        assert unserved.value.not_served, "a 404 naming no object: the resource is not served (a CRD upgrading)"
        assert "the apiserver of Airflow connection 'never-accepted' does not serve this resource now" in \
            str(unserved.value), "which connection's cluster lacks it"
        assert attempts.after(error(kind, 401)) == Retry(0.0, reload=True)
        with pytest.raises(VolcanoApiError, match="get Job ml/a failed: HTTP 401 x: said the apiserver"):
            attempts.after(error(kind, 401))  # credentials never accepted: read again once only
        throttled = Attempts(retry_policy_hook("never-accepted", 2), "list Jobs")
        assert throttled.after(error(kind, 429, retry_after="3600")) == Retry(30.0), "Retry-After, capped"
        assert 0 <= throttled.after(error(kind, 503)).delay <= 1.0
        with pytest.raises(VolcanoApiError, match="HTTP 503"):
            throttled.after(error(kind, 503))  # retries spent
        with pytest.raises(VolcanoApiError, match="HTTP 404"):
            Attempts(retry_policy_hook("never-accepted", 2), "delete Job ml/a",
                     if_absent=REQUIRED).after(error(kind, 404, names="a"))


@pytest.mark.parametrize("before", [None, 429, 503, 500, "lost"])
def test_a_403_is_retried_only_just_after_the_apiserver_was_unavailable(monkeypatch, before):
    """A restarting apiserver answers 403 while its RBAC cache fills. Behind a load balancer (the chaos soak's
    proxy) the restart is answered 503, then the apiserver's own 500, then 403: such a 403 is retried for
    AUTH_WARMUP_SECONDS. After throttling (429) or nothing, a 403 is a missing permission, said at once."""

    from kubernetes.client.rest import ApiException

    from airflow_volcano.hooks import retry
    from airflow_volcano.hooks.retry import AUTH_WARMUP_SECONDS, Attempts

    now = [1000.0]
    monkeypatch.setattr(retry.time, "monotonic", lambda: now[0])
    attempts = Attempts(retry_policy_hook("c", 6), "list Jobs in ml")
    if before is not None:
        attempts.after(ConnectionRefusedError() if before == "lost" else ApiException(status=before, reason="x"))
    forbidden = ApiException(status=403, reason="Forbidden")
    if before in (None, 429):
        with pytest.raises(VolcanoApiError, match="HTTP 403 Forbidden"):
            attempts.after(forbidden)
        return
    assert attempts.after(forbidden).delay > 0, "retried: the apiserver was not serving a moment ago"
    now[0] += AUTH_WARMUP_SECONDS + 1
    with pytest.raises(VolcanoApiError, match="HTTP 403 Forbidden"):
        Attempts(retry_policy_hook("c", 6), "list Jobs in ml").after(forbidden)


def test_credentials_accepted_before_and_refused_now_are_read_again_with_back_off_for_a_bounded_time(monkeypatch):
    """An expired token (or an apiserver that cannot check tokens for a while) must not end a wait:
    the credentials are read again before every retry, for AUTH_REFUSED_SECONDS, then the 401 is said."""

    from kubernetes.client.rest import ApiException

    from airflow_volcano.hooks import retry
    from airflow_volcano.hooks.retry import AUTH_REFUSED_SECONDS, Attempts

    now = [1000.0]
    monkeypatch.setattr(retry.time, "monotonic", lambda: now[0])
    hook = retry_policy_hook("accepted-before", 2)
    hook.note_credentials_accepted()
    attempts = Attempts(hook, "get Job ml/a")
    refused = ApiException(status=401, reason="Unauthorized")
    first = attempts.after(refused)
    assert first.reload and first.delay == 0
    steps = []
    while now[0] < 1000.0 + AUTH_REFUSED_SECONDS - 10:
        step = attempts.after(refused)
        steps.append(step)
        now[0] += step.delay
    assert len(steps) > 10, "more than the 6 retries of a transient error"
    assert all(step.reload and 0 < step.delay <= 10.0 for step in steps), "every retry reads them again, backed off"
    now[0] = 1000.0 + AUTH_REFUSED_SECONDS + 1
    with pytest.raises(VolcanoApiError, match="HTTP 401 Unauthorized"):
        attempts.after(refused)


def test_a_hook_whose_call_succeeded_retries_a_401_that_outlasts_one_reading_of_the_credentials(monkeypatch):
    """Through the async hook: a success marks its credentials accepted; a 401 on three reads in a row
    (longer than one re-reading) is then retried until the apiserver accepts them again."""
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    job = {"metadata": {"name": "train", "namespace": "ml"}}

    def refused() -> AsyncApiException:
        failure = AsyncApiException(status=401, reason="Unauthorized")
        failure.headers = {}
        return failure

    async def scenario() -> tuple[Any, Any, int]:
        transport = ScriptedTransport(job, refused(), refused(), refused(), job)
        hook = async_hook(transport)
        reloads = 0

        async def reload_credentials() -> None:
            nonlocal reloads
            reloads += 1

        hook.reload_credentials = reload_credentials
        first = await hook.run(calls.get_job("train", "ml"))
        return first, await hook.run(calls.get_job("train", "ml")), reloads

    first, again, reloads = asyncio.run(scenario())
    assert first == again == job
    assert reloads == 3, "read again before each retry"


class ScriptedTransport(async_client.ApiClient):
    """kubernetes_asyncio's ApiClient whose `call_api` answers from a script: an exception to raise,
    or a value to return, one per request; what was asked is kept."""

    def __init__(self, *answers: Any) -> None:
        super().__init__()
        self.answers, self.asked = list(answers), []

    async def call_api(self, resource_path: str, method: str, *args: Any, **kwargs: Any) -> Any:
        query = kwargs.get("query_params", args[1] if len(args) > 1 else None)
        self.asked.append((method, resource_path, list(query or []), kwargs.get("body")))
        answer = self.answers.pop(0)
        if not self.answers:
            await self.close()  # its session: nothing more will be asked
        if isinstance(answer, BaseException):
            raise answer
        return answer


def async_hook(transport: ScriptedTransport) -> Any:
    from airflow_volcano.hooks.volcano import AsyncVolcanoHook

    hook = AsyncVolcanoHook("kubernetes_default", retries=3)
    hook._shared = (None, transport)  # every call uses this client (as shared_client() does)
    return hook


def unavailable() -> AsyncApiException:
    failure = AsyncApiException(status=503, reason="Service Unavailable")
    failure.headers = {"Retry-After": "0", "Audit-Id": "secret-audit-id", "Authorization": "Bearer t0ken"}
    failure.body = '{"message": "etcd is busy"}'
    return failure


def test_the_async_delete_retries_transient_errors_and_answers_a_404_as_gone(monkeypatch):
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)

    async def scenario() -> tuple[bool, list, bool]:
        transport = ScriptedTransport(unavailable(), unavailable(), {"status": "Success"})
        deleted = await async_hook(transport).drive(calls.delete_job("train", "ml"))
        gone = AsyncApiException(status=404, reason="Not Found")
        gone.body = '{"kind": "Status", "reason": "NotFound", "details": {"name": "train", "kind": "jobs"}}'
        again = await async_hook(ScriptedTransport(gone)).drive(calls.delete_job("train", "ml"))
        return deleted, transport.asked, again

    deleted, asked, again = asyncio.run(scenario())
    assert deleted is True and [method for method, *_ in asked] == ["DELETE"] * 3
    assert ("propagationPolicy", "Background") in asked[0][2]
    assert again is False


class LogResponse:
    status, reason = 200, "OK"

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.content = self

    async def iter_chunked(self, size: int) -> Any:
        for start in range(0, len(self.body), size):
            yield self.body[start:start + size]

    def release(self) -> None:
        pass


def test_the_async_log_read_goes_through_the_retry_policy(monkeypatch):
    """It used to bypass it: one 503 from the apiserver lost a copy of the log."""
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)

    async def read() -> tuple[bytes, int]:
        transport = ScriptedTransport(unavailable(), LogResponse(b"2026-11-24T10:00:00Z hello\n"))
        chunks = async_hook(transport).pod_log_chunks("train-master-0", "ml", container="master", since=None)
        return b"".join([chunk async for chunk in chunks]), len(transport.asked)

    assert asyncio.run(read()) == (b"2026-11-24T10:00:00Z hello\n", 2)


def test_a_log_read_starts_at_the_last_line_shown_on_the_nodes_own_clock_whenever_it_is_sent(monkeypatch):
    """A relative sinceSeconds was worked out with the reader's clock and counted back by the kubelet from
    the node's: a node clock ahead of the reader's skipped lines (and a read retried after a back-off
    skipped what the pod printed meanwhile). sinceTime is the last line's own timestamp (whole seconds,
    rounded down: the cursor drops what was shown), the same at every attempt, with no clock involved."""
    import time

    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    monkeypatch.setattr(time, "time", lambda: 99999.0)  # whatever the reader's clock says
    refused = unavailable()
    refused.headers = {"Retry-After": "5"}

    async def read() -> list[tuple[str, list]]:
        transport = ScriptedTransport(refused, refused, LogResponse(b""))
        chunks = async_hook(transport).pod_log_chunks("train-master-0", "ml", container="master",
                                                      since=1795540866.75)
        assert [chunk async for chunk in chunks] == []
        return [(path, query) for _, path, query, _ in transport.asked]

    asked = asyncio.run(read())
    assert len(asked) == 3
    for path, query in asked:
        assert path == "/api/v1/namespaces/{namespace}/pods/{name}/log", path
        assert ("sinceTime", "2026-11-24T17:21:06Z") in query and ("timestamps", "true") in query, query
        assert ("container", "master") in query and not [key for key, _ in query if key == "sinceSeconds"]
    assert "sinceTime" not in dict(calls.read_pod_log("p", "ml", container=None).kwargs["query_params"])


def test_an_api_error_that_stays_names_the_call_and_never_the_headers(monkeypatch):
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)

    async def scenario() -> None:
        await async_hook(ScriptedTransport(*[unavailable() for _ in range(4)])).run(calls.get_job("train", "ml"))

    with pytest.raises(VolcanoApiError) as raised:
        asyncio.run(scenario())
    assert str(raised.value) == "get Job ml/train failed: HTTP 503 Service Unavailable: etcd is busy"
    assert short(unavailable()) == "HTTP 503 Service Unavailable", "the retry warning's words: no headers"
    assert "t0ken" not in str(raised.value) and "secret-audit-id" not in str(raised.value)


def test_a_program_of_calls_is_driven_the_same_by_both_hooks():
    """create_job: a 409 means a Job of that name exists (an earlier create whose answer was lost):
    it is read and returned. The same generator, driven blocking and on an event loop."""
    from airflow_volcano.hooks.volcano import AsyncVolcanoHook, VolcanoHook

    existing = {"metadata": {"name": "train", "labels": {"a": "b"}}}
    conflict = VolcanoApiError("create Job ml/train", 409, "Conflict")

    def script() -> Any:
        answers = [conflict, existing]
        asked: list[str] = []

        def answer(call: calls.Call[Any]) -> Any:
            asked.append(call.what)
            value = answers.pop(0)
            if isinstance(value, BaseException):
                raise value
            return value

        return answer, asked

    sync_answer, sync_asked = script()
    sync_hook = object.__new__(VolcanoHook)
    sync_hook.run = sync_answer  # type: ignore[method-assign]
    assert sync_hook.drive(calls.create_job("ml", {"metadata": {"name": "train"}})) == existing

    async_answer, async_asked = script()
    hook = object.__new__(AsyncVolcanoHook)

    async def run(call: calls.Call[Any]) -> Any:
        return async_answer(call)

    hook.run = run  # type: ignore[method-assign]
    assert asyncio.run(hook.drive(calls.create_job("ml", {"metadata": {"name": "train"}}))) == existing
    assert sync_asked == async_asked == ["create Job ml/train", "get Job ml/train"]


def test_a_lost_pod_is_deleted_only_as_the_pod_it_was_seen_as():
    """A uid precondition: a replacement of the same name (Volcano's, after a restart) is never deleted;
    the apiserver answers 409 and the program says it was not deleted."""
    program = calls.delete_pod("train-worker-0", "ml", "uid-1", grace_seconds=0)
    call = next(program)
    assert call.kwargs["body"] == {"preconditions": {"uid": "uid-1"}, "gracePeriodSeconds": 0}
    with pytest.raises(StopIteration) as stopped:
        program.throw(VolcanoApiError("delete pod ml/train-worker-0", 409, "Conflict", "Precondition failed"))
    assert stopped.value.value is False


async def _no_sleep(seconds: float) -> None:
    return None


def test_a_quiet_jobs_watch_whose_version_expired_starts_again_from_now():
    """A Job unchanged for longer than the apiserver keeps history: watching from its resourceVersion
    gets 410 Gone. The watch starts again from now (no version), whose first event is the Job as it
    is, instead of ending and re-reading the same too-old version again and again."""
    import json

    from airflow_volcano.hooks.volcano import VolcanoHook

    job = {"metadata": {"name": "train", "namespace": "ml", "resourceVersion": "5"}, "status": {}}
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version: 5 (900)"}}
    answers = [[gone], [{"type": "ADDED", "object": job}]]
    versions: list[str] = []

    class Response:
        def __init__(self, events: list[dict]) -> None:
            self.events = events

        def stream(self, *args: Any, **kwargs: Any) -> Any:
            yield from (json.dumps(event).encode() + b"\n" for event in self.events)

        def close(self) -> None:
            pass

        def release_conn(self) -> None:
            pass

    class CustomObjects:
        def list_namespaced_custom_object(self, *args: Any, resource_version: str, **kwargs: Any) -> Response:
            versions.append(resource_version)
            return Response(answers.pop(0))

    hook = VolcanoHook("kubernetes_default")
    hook.__dict__["custom_objects"] = CustomObjects()
    seen = list(hook.watch_job("train", "ml", resource_version="5", timeout_seconds=60))
    assert versions == ["5", ""], "then from now"
    assert [(kind, j["metadata"]["resourceVersion"]) for kind, j in seen] == [("ADDED", "5")]


def test_a_jobs_watch_refused_for_credentials_accepted_before_ends_for_a_re_read_and_otherwise_says_the_401():
    """The worker's watch of its Job: a 401 after the credentials worked reads them again and ends the
    watch (the wait engine re-reads the Job after its back-off, which retries the 401); with
    credentials never accepted the 401 is said at once."""
    from kubernetes.client.rest import ApiException

    from airflow_volcano.hooks.volcano import VolcanoHook

    class CustomObjects:
        def list_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> Any:
            raise ApiException(status=401, reason="Unauthorized")

    hook = VolcanoHook("watch-refused")  # a connection of its own: acceptance is remembered per process
    hook.__dict__["custom_objects"] = CustomObjects()
    with pytest.raises(VolcanoApiError, match="watch Job ml/train failed: HTTP 401"):
        list(hook.watch_job("train", "ml", resource_version="5", timeout_seconds=60))

    hook.note_credentials_accepted()
    hook.__dict__["custom_objects"] = CustomObjects()
    assert list(hook.watch_job("train", "ml", resource_version="5", timeout_seconds=60)) == []
    assert "custom_objects" not in hook.__dict__, "the client is built again from the connection"


# -- each hook's own client configuration -------------------------------------------------------------

def _kubeconfig(server: str, token: str) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": server, "certificate-authority": certifi.where()}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}


@pytest.fixture
def connections(tmp_path, monkeypatch) -> dict[str, tuple[str, str]]:
    """Connections of every kind cncf-kubernetes loads (conn id -> the apiserver and token its client
    must use), and a pod's in-cluster service account (host and token)."""
    import kubernetes.config.incluster_config as sync_in_cluster
    import kubernetes_asyncio.config.incluster_config as async_in_cluster

    (tmp_path / "token").write_text("in-cluster-token")
    for module in (sync_in_cluster, async_in_cluster):
        monkeypatch.setattr(module, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
        monkeypatch.setattr(module, "SERVICE_CERT_FILENAME", certifi.where())
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    (tmp_path / "kubeconfig").write_text(json.dumps(_kubeconfig("https://path.example:6443", "path-token")))
    extras = {
        "kubeconfig_path": {"kube_config_path": str(tmp_path / "kubeconfig")},
        "kubeconfig_content": {"kube_config": json.dumps(_kubeconfig("https://content.example:6443", "content-token"))},
        "in_cluster": {"in_cluster": True},
    }
    for conn_id, extra in extras.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                           json.dumps({"conn_type": "kubernetes", "extra": extra}))
    return {"kubeconfig_path": ("https://path.example:6443", "path-token"),
            "kubeconfig_content": ("https://content.example:6443", "content-token"),
            "in_cluster": ("https://10.96.0.1:443", "in-cluster-token")}


def _credentials(configuration: Any) -> tuple[str, str]:
    token = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken") or ""
    return configuration.host, token.split(" ", 1)[-1]


@pytest.mark.parametrize("conn_id", ["kubeconfig_path", "kubeconfig_content", "in_cluster"])
def test_each_hook_calls_with_its_connection_on_a_configuration_of_its_own(connections, conn_id):
    """On every cncf-kubernetes release the floor allows: before 10.15 its sync hook built the client on
    the process-wide default configuration (a kubeconfig connection reached no apiserver), before 10.17.1
    its async hook loaded the connection there, and on every release it loads an in-cluster connection
    there (the sync client had none). The process-wide defaults stay as they were."""
    from kubernetes import client
    from kubernetes_asyncio import client as async_client

    from airflow_volcano.hooks.volcano import AsyncVolcanoHook, VolcanoHook

    defaults = client.Configuration._default, async_client.Configuration._default

    assert _credentials(VolcanoHook(conn_id).api_client.configuration) == connections[conn_id]

    async def async_credentials() -> tuple[tuple[str, str], tuple[str, str]]:
        hook = AsyncVolcanoHook(conn_id)
        async with hook.get_conn() as api:
            first = _credentials(api.configuration)
        async with hook.shared_client(), hook.get_conn() as api:
            return first, _credentials(api.configuration)

    assert asyncio.run(async_credentials()) == (connections[conn_id], connections[conn_id])
    assert (client.Configuration._default, async_client.Configuration._default) == defaults


def test_triggers_of_two_connections_in_one_triggerer_each_keep_their_own(connections):
    """A trigger whose client was opened before another connection's must not call with that one's
    credentials (cncf-kubernetes before 10.17.1 shared one process-wide configuration among them)."""
    from airflow_volcano.hooks.volcano import AsyncVolcanoHook

    async def opened_in_turn() -> list[tuple[str, str]]:
        hooks = [AsyncVolcanoHook(conn_id) for conn_id in ("kubeconfig_path", "kubeconfig_content", "in_cluster")]
        seen = []
        for hook in hooks + hooks:
            async with hook.get_conn() as api:
                seen.append(_credentials(api.configuration))
        return seen

    expected = [connections["kubeconfig_path"], connections["kubeconfig_content"], connections["in_cluster"]]
    assert asyncio.run(opened_in_turn()) == expected * 2


def test_a_connection_that_disables_tls_verification_does_so_on_the_hooks_own_client(connections, monkeypatch):
    """cncf-kubernetes before 10.15 turned verification off on the process-wide default only."""
    from kubernetes import client

    from airflow_volcano.hooks.volcano import VolcanoHook

    kubeconfig = json.dumps(_kubeconfig("https://unverified.example:6443", "t"))
    monkeypatch.setenv("AIRFLOW_CONN_UNVERIFIED", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config": kubeconfig, "disable_verify_ssl": "true"}}))
    before = client.Configuration._default
    try:
        assert VolcanoHook("unverified").api_client.configuration.verify_ssl is False
        assert VolcanoHook("kubeconfig_path").api_client.configuration.verify_ssl is True
    finally:
        client.Configuration._default = before  # cncf-kubernetes' own doing, before 10.15
