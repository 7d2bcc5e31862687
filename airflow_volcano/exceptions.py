"""The provider's own exceptions: the hooks translate the Kubernetes clients' errors into these,
so operators, sensors and triggers never import `kubernetes` and users read one or two clear
sentences instead of an HTTP header dump."""

from __future__ import annotations

import json
from typing import Any


class VolcanoApiError(RuntimeError):
    """A Kubernetes API call failed for good (not a transient error, or retries ran out).

    :param what: the call, as a person would say it ("create Job ml/train").
    :param status: the HTTP status (0 when no answer came).
    :param reason: the HTTP reason phrase.
    :param message: the apiserver's own message (the `message` of its Status body), if any.
    :param not_served: a 404 that names no object: the apiserver does not serve the resource at all
        (its CRD removed, or unserved while Volcano is upgraded), which says nothing of the object.
    :param server: the address of the apiserver that answered, if known.
    :param conn_id: the Airflow connection the call went through, if known.
    """

    def __init__(self, what: str, status: int, reason: str, message: str | None = None, *,
                 not_served: bool = False, server: str | None = None, conn_id: str | None = None) -> None:
        self.what, self.status, self.reason, self.message = what, status, reason, message
        self.not_served = not_served
        self.server, self.conn_id = server, conn_id  # which apiserver, of which Airflow connection, if known
        super().__init__(self.describe())

    @classmethod
    def from_api_exception(cls, what: str, error: Any, server: str | None = None,
                           conn_id: str | None = None) -> VolcanoApiError:
        """From either client's ApiException (kubernetes or kubernetes_asyncio): status, reason,
        and the message of the JSON body; never the headers. `server`, `conn_id`: who answered."""
        message = None
        try:
            message = json.loads(error.body).get("message")
        except (TypeError, ValueError, AttributeError):
            pass
        status = int(getattr(error, "status", 0) or 0)
        return cls(what, status, str(getattr(error, "reason", "") or ""), message,
                   not_served=status == 404 and not names_an_object(error), server=server, conn_id=conn_id)

    def apiserver(self) -> str:
        """"the apiserver https://host:port of Airflow connection 'id'", as far as it is known."""
        return " ".join(["the apiserver", *filter(None, [self.server])]) + (
            f" of Airflow connection {self.conn_id!r}" if self.conn_id is not None else "")

    def denied_by_admission(self) -> bool:
        """A refusal by an admission policy (deploy/admission-policy.yaml) or webhook, after RBAC allowed
        the request: "... is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: ..."
        or "admission webhook "w" denied the request: ..."."""
        message = self.message or ""
        return ("ValidatingAdmissionPolicy" in message and "denied request" in message) or (
            "admission webhook" in message and "denied the request" in message)

    def brief(self) -> str:
        """The call, the status and the apiserver's message, without advice (the caller gives its own)."""
        text = f"{self.what} failed: HTTP {self.status} {self.reason}".rstrip()
        return f"{text}: {self.message}" if self.message else text

    def describe(self) -> str:
        text = self.brief()
        if self.not_served:
            text += (f": {self.apiserver()} does not serve this resource now (Volcano's CRDs not installed, or being "
                     "upgraded)")
        elif self.status == 403 and self.denied_by_admission():
            pass  # the policy's or webhook's own message says why; no permission is missing
        elif self.status == 403:
            text += (". The Airflow connection's identity lacks this permission: grant it "
                     "(deploy/rbac.yaml lists every permission the provider needs)")
        elif self.status == 401:
            text += ". The Airflow connection's credentials were refused: check its kubeconfig or token"
        return text


class ApiserverUnreachable(VolcanoApiError):
    """No answer from the apiserver after the retry policy's attempts: refused or reset connections, a
    name that does not resolve, a TLS handshake that fails, timeouts.

    :param what: the call, as a person would say it.
    :param conn_id: the Airflow connection the hook uses.
    :param server: the apiserver's address, as the connection gives it.
    :param cause: the last failure, in a few words ("Connection refused").
    :param seconds: how long the attempts went on.
    """

    def __init__(self, what: str, conn_id: str | None, server: str | None, cause: str, seconds: float) -> None:
        self.cause, self.seconds = cause, seconds
        super().__init__(what, 0, "no answer", server=server, conn_id=conn_id)

    def describe(self) -> str:
        return (f"{self.what} failed: no answer from the Kubernetes apiserver {self.server or '(unknown address)'} "
                f"of Airflow connection {self.conn_id!r} ({self.cause}; tried for {self.seconds:.0f}s): check the "
                "connection's server address and credentials, and that this machine can reach it")


class KubernetesConnectionError(RuntimeError):
    """The Airflow connection's Kubernetes configuration could not be loaded (a kubeconfig that is not
    there, names a file that is not, or has no usable context); the message names the connection."""

    def __init__(self, conn_id: str | None, problem: str) -> None:
        text = f"Airflow connection {conn_id!r} could not be loaded: {problem}"
        if "does not exist" in problem:
            text += (" (a file its kubeconfig names is not on this machine; in a container only what is mounted "
                     "is: mount it too, or use a kubeconfig with the certificates inline: `kubectl config view "
                     "--flatten --minify`)")
        super().__init__(text)
        self.conn_id = conn_id


def names_an_object(error: Any) -> bool:
    """Whether an error's Status body names the object it is about (`details.name`): the apiserver's
    404 for an object that does not exist does; its 404 for a resource it does not serve (a path no
    API group answers: "the server could not find the requested resource", or a bare "404 page not
    found") does not."""
    try:
        body = json.loads(error.body)
    except (TypeError, ValueError, AttributeError):
        return False
    details = body.get("details") if isinstance(body, dict) else None
    return isinstance(details, dict) and bool(details.get("name"))


class JobSpecError(ValueError):
    """A bad argument or template, found before anything is submitted; the message names the
    parameter and the bad value."""


class VolcanoJobError(RuntimeError):
    """The Job failed, timed out or could not start; the message says why."""


class WatchExpired(RuntimeError):
    """The apiserver no longer has the resourceVersion a watch asked to resume from (410 Gone):
    the watcher must list again."""
