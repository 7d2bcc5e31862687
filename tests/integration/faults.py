"""An HTTP proxy in front of the test apiserver that answers some requests with 429 or 503, refuses
every delete of a Volcano Job for a while (an apiserver the cleanup cannot reach), or fails every
pod log read while asked to (an apiserver that cannot reach a kubelet). For the chaos soak
(benchmarks/chaos_soak.py) it can also be told, while it runs, to slow every request down, to cut the
watch and log streams open, and to send an expired token (the apiserver itself answers 401).

It forwards everything else (streaming, so watches and followed logs work) to the real
kube-apiserver over TLS. Loopback only; it stops with the test.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import ClientConnectorError, ClientPayloadError, ClientSession, ClientTimeout, TCPConnector, web

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class FaultyProxy:
    def __init__(self, upstream: str, ca_file: Path, every: int = 3, job_deletes_fail_for: float = 0.0) -> None:
        self.upstream = upstream
        self.ca_file = ca_file
        self.every = every  # every Nth request fails (0: none)
        # From the first DELETE of a Volcano Job, every such DELETE fails with 503 for this many seconds.
        self.job_deletes_fail_for = job_deletes_fail_for
        self.job_deletes_fail_until: float | None = None
        self.job_deletes_refused = 0
        self.injected = 0
        self.forwarded = 0
        # While set, every pod log read fails with 503 and the log streams open are cut.
        self.logs_fail = threading.Event()
        self.log_reads_refused = 0
        # Every pod log read that reached the proxy, by path (/api/v1/namespaces/<ns>/pods/<pod>/log).
        self.log_reads: collections.Counter[str] = collections.Counter()
        self._counter = itertools.count(1)
        self._codes = itertools.cycle([429, 503, 500])
        self.retry_after = "0"  # the Retry-After of an injected 429, in seconds
        self.latency = 0.0  # seconds added before each request is forwarded
        # Seconds each create of a Volcano Job is held before it is forwarded (a create in flight), and
        # how many such creates arrived.
        self.job_create_delay = 0.0
        self.job_creates_seen = 0
        # Seconds the answer to each create of a Volcano Job is held once the apiserver made it (a Job
        # that exists before its creator knows it).
        self.job_create_answer_delay = 0.0
        # While set, each request carries a token the apiserver does not accept (one that expired).
        self.token_expired = threading.Event()
        self.streams_cut = 0
        self._streams: dict[int, web.Request] = {}  # id -> request
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0

    def __enter__(self) -> FaultyProxy:
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _stop(self) -> None:
        # Followed log streams never end on their own: their handlers are cancelled, not awaited
        # (a loop stopped with them pending prints "Task was destroyed but it is pending!").
        await self._session.close()
        await self._runner.cleanup()
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def cut_streams(self) -> None:
        """Close every watch and followed log stream open now, as a restarted load balancer would."""
        def cut() -> None:
            for request in list(self._streams.values()):
                if request.transport is not None:
                    request.transport.close()
                    self.streams_cut += 1
        self._loop.call_soon_threadsafe(cut)

    def log_reads_of(self, namespace: str, pod: str) -> int:
        return self.log_reads[f"/api/v1/namespaces/{namespace}/pods/{pod}/log"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        # The body is passed on as the apiserver sent it (gzip and all), under the headers it came with.
        self._session = ClientSession(connector=TCPConnector(ssl=context), timeout=ClientTimeout(total=None),
                                      auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        log_read = request.path.endswith("/log")
        if log_read:
            self.log_reads[request.path] += 1
        if log_read and self.logs_fail.is_set():
            self.log_reads_refused += 1
            return web.Response(status=503, text=json.dumps({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                "message": "injected by the test's faulty proxy: the kubelet cannot be reached"}),
                content_type="application/json")
        if request.method == "DELETE" and "/batch.volcano.sh/" in request.path and self.job_deletes_fail_for:
            now = time.monotonic()
            if self.job_deletes_fail_until is None:
                self.job_deletes_fail_until = now + self.job_deletes_fail_for
            if now < self.job_deletes_fail_until:
                self.job_deletes_refused += 1
                return web.Response(status=503, text=json.dumps({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                    "message": "injected by the test's faulty proxy: deletes fail"}), content_type="application/json")
        if self.every and next(self._counter) % self.every == 0:
            self.injected += 1
            code = next(self._codes)
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                    "message": "injected by the test's faulty proxy"}
            return web.Response(status=code, text=json.dumps(body), content_type="application/json",
                                headers={"Retry-After": self.retry_after} if code == 429 else None)
        if self.latency:
            await asyncio.sleep(self.latency)
        job_create = (request.method == "POST" and "/batch.volcano.sh/" in request.path
                      and request.path.endswith("/jobs"))
        if job_create:
            self.job_creates_seen += 1
            await asyncio.sleep(self.job_create_delay)
        self.forwarded += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if self.token_expired.is_set():
            headers["Authorization"] = "Bearer expired-token"  # the apiserver's own 401
        streaming = "true" in (request.query.get("watch", "").lower(), request.query.get("follow", "").lower())
        if streaming:
            self._streams[id(request)] = request
        try:
            return await self._forward(request, headers, log_read, self.job_create_answer_delay if job_create else 0)
        except ClientConnectorError:  # the apiserver is down (restarting): what a load balancer would answer
            return web.Response(status=503, text=json.dumps({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                "message": "the apiserver cannot be reached"}), content_type="application/json")
        finally:
            self._streams.pop(id(request), None)

    async def _forward(self, request: web.Request, headers: dict[str, str], log_read: bool,
                       hold: float) -> web.StreamResponse:
        async with self._session.request(request.method, self.upstream + request.rel_url.raw_path_qs,
                                         headers=headers, data=await request.read()) as upstream:
            await asyncio.sleep(hold)
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    if log_read and self.logs_fail.is_set():
                        break  # the connection to the kubelet is gone: so is the stream
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:  # the client is gone (or its stream was cut): nothing to tell it
                pass
            except ClientPayloadError:  # the apiserver dropped the stream mid-way: so does the proxy, quietly
                if request.transport is not None:
                    request.transport.abort()
            return response


def through(proxy: FaultyProxy, operator_kubeconfig: Path, namespace: str, monkeypatch: object) -> None:
    """Make Airflow's kubernetes_default reach the apiserver through `proxy`, as the operator's least
    privileged identity (the harness's own admin client still talks to the apiserver directly)."""
    config = json.loads(operator_kubeconfig.read_text())
    config["clusters"][0]["cluster"] = {"server": proxy.url}
    proxied = operator_kubeconfig.with_name("proxied-kubeconfig.json")
    proxied.write_text(json.dumps(config))
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(proxied), "namespace": namespace}}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(connection))  # type: ignore[attr-defined]


def upstream_of(operator_kubeconfig: Path) -> str:
    return json.loads(operator_kubeconfig.read_text())["clusters"][0]["cluster"]["server"]


def fault_window(fault: threading.Event, seconds: float, after: Callable[[], object]) -> tuple[threading.Thread,
                                                                                         dict[str, float]]:
    """On a thread, started: once `after()` returns, set `fault` (one of the proxy's) for `seconds`, then
    clear it. Returns the thread and the window, which gets "from" and "to" (epoch seconds) as they happen."""
    window: dict[str, float] = {}

    def strike() -> None:
        after()
        fault.set()
        window["from"] = time.time()
        time.sleep(seconds)
        fault.clear()
        window["to"] = time.time()

    thread = threading.Thread(target=strike)
    thread.start()
    return thread, window
