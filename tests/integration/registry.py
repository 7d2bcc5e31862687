"""A tiny container registry (Docker Registry HTTP API v2) on loopback for the real node's image pulls.

It serves one image, the local training image, read from containerd's content store: its manifest
(bytes as containerd keeps them, so the digest is the same) and, if asked, its blobs. Each repository
has a behaviour: `missing` answers 404 MANIFEST_UNKNOWN, as a registry does for an image it does not
have; `flaky` answers 503 for a while (a registry overloaded or restarting), then serves the image.
Every request is recorded (method, path, status) so a test can show the registry was really asked.
containerd pulls `localhost:<port>/...` over plain HTTP, so pods use `image(repository)` with
imagePullPolicy IfNotPresent. Not a test file: test_image_pulls.py uses it.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .conftest import Containerd

MANIFEST = re.compile(r"^/v2/(?P<name>.+)/manifests/(?P<ref>[^/]+)$")
BLOB = re.compile(r"^/v2/(?P<name>.+)/blobs/(?P<digest>sha256:[0-9a-f]{64})$")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    status: int
    at: float  # time.monotonic()


@dataclass
class Flaky:
    """503 for the first `failures` manifest requests, or for `seconds` from the first one."""

    failures: int | None = None
    seconds: float | None = None
    asked: int = 0
    first_at: float | None = None

    def fails_now(self) -> bool:
        now = time.monotonic()
        self.asked += 1
        if self.first_at is None:
            self.first_at = now
        if self.failures is not None:
            return self.asked <= self.failures
        return now - self.first_at < (self.seconds or 0)


class Registry:
    """The registry, serving `source_image` from containerd; a context manager that starts it on a free
    port of 127.0.0.1 and, on exit, stops it and removes the images containerd pulled from it."""

    def __init__(self, containerd: Containerd, source_image: str) -> None:
        self.containerd = containerd
        digest = self._image_digest(source_image)
        # As bytes: Containerd.ctr decodes text (newlines translated), and the digest is of the bytes.
        self.manifest = subprocess.run(["ctr", f"--address={containerd.socket}", "--namespace=k8s.io", "content",
                                        "get", digest], capture_output=True, check=True).stdout
        self.manifest_digest = digest
        parsed = json.loads(self.manifest)
        self.media_type = parsed["mediaType"]
        self.blob_sizes = {item["digest"]: int(item["size"]) for item in [parsed["config"], *parsed["layers"]]}
        self.behaviours: dict[str, str | Flaky] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _image_digest(self, image: str) -> str:
        for line in self.containerd.ctr("images", "ls", f"name=={image}").splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == image:
                return fields[2]
        raise AssertionError(f"{image} is not in containerd's k8s.io namespace")

    # -- behaviours ------------------------------------------------------------------------------

    def missing(self, repository: str) -> str:
        """A repository whose manifests are unknown (404 MANIFEST_UNKNOWN); returns its image."""
        self.behaviours[repository] = "missing"
        return self.image(repository)

    def flaky(self, repository: str, *, failures: int | None = None, seconds: float | None = None) -> str:
        """A repository that answers 503 for a while, then serves the image; returns its image."""
        self.behaviours[repository] = Flaky(failures=failures, seconds=seconds)
        return self.image(repository)

    @property
    def port(self) -> int:
        assert self._server is not None, "the registry is not started"
        return self._server.server_address[1]

    def image(self, repository: str, tag: str = "dev") -> str:
        return f"localhost:{self.port}/{repository}:{tag}"

    def seen(self, method: str | None = None, path: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method)
                    and (path is None or r.path == path)]

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Registry:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="registry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        self.remove_pulled_images()

    def pulled_images(self) -> list[str]:
        """containerd's images named after this registry (the tag and the repo digest the CRI records)."""
        prefix = f"localhost:{self.port}/"
        return [name for name in self.containerd.ctr("images", "ls", "--quiet").split() if name.startswith(prefix)]

    def remove_pulled_images(self) -> None:
        # Only these names: their content is the training image's, which other names still hold.
        names = self.pulled_images()
        if names:
            self.containerd.ctr("images", "rm", *names)

    # -- HTTP ------------------------------------------------------------------------------------

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append(Request(method, path, status, time.monotonic()))

    def _manifest_answer(self, name: str, ref: str) -> tuple[int, dict[str, str], bytes]:
        behaviour = self.behaviours.get(name)
        if behaviour is None or behaviour == "missing":
            return _error(404, "MANIFEST_UNKNOWN" if behaviour else "NAME_UNKNOWN",
                          "manifest unknown" if behaviour else "repository name not known to registry")
        assert isinstance(behaviour, Flaky)
        with self._lock:
            fails = behaviour.fails_now()
        if fails:
            return _error(503, "UNAVAILABLE", "service unavailable")
        if ref not in ("dev", self.manifest_digest):
            return _error(404, "MANIFEST_UNKNOWN", "manifest unknown")
        return 200, {"Content-Type": self.media_type, "Docker-Content-Digest": self.manifest_digest}, self.manifest

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                pass  # recorded in registry.requests instead

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                self._answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                path = self.path.split("?", 1)[0]
                if path in ("/v2", "/v2/"):
                    status, headers, content = 200, {"Content-Type": "application/json"}, b"{}"
                elif match := MANIFEST.match(path):
                    status, headers, content = registry._manifest_answer(match["name"], match["ref"])
                elif (match := BLOB.match(path)) and match["digest"] in registry.blob_sizes:
                    registry._record(self.command, path, 200)
                    self._send_blob(match["digest"], body)
                    return
                elif BLOB.match(path):
                    status, headers, content = _error(404, "BLOB_UNKNOWN", "blob unknown to registry")
                else:
                    status, headers, content = _error(404, "NAME_UNKNOWN", "repository name not known to registry")
                registry._record(self.command, path, status)
                self.send_response(status)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Content-Length", str(len(content)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if body:
                    self.wfile.write(content)

            def _send_blob(self, digest: str, body: bool) -> None:
                self.send_response(200)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Docker-Content-Digest", digest)
                self.send_header("Content-Length", str(registry.blob_sizes[digest]))
                self.end_headers()
                if not body:
                    return
                # Streamed: a layer of the training image is ~1.8 GB.
                with subprocess.Popen(["ctr", f"--address={registry.containerd.socket}", "--namespace=k8s.io",
                                       "content", "get", digest], stdout=subprocess.PIPE) as source:
                    assert source.stdout is not None
                    while chunk := source.stdout.read(1 << 20):
                        self.wfile.write(chunk)

        return Handler


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
    return status, {"Content-Type": "application/json"}, body
