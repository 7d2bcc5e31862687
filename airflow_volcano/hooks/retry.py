"""The one retry policy both hooks follow: which failures are worth another try, how long to wait,
when to read the credentials again, and how an error that stays is reported.

The sync and the async hook each run a `Call` through `Attempts`; the policy lives only here, so the
two cannot drift apart.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import aiohttp
from kubernetes.client.rest import ApiException
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException
from urllib3.exceptions import HTTPError as Urllib3HTTPError
from urllib3.exceptions import MaxRetryError, ReadTimeoutError
from urllib3.util.retry import Retry as Urllib3Retry

from airflow_volcano.exceptions import ApiserverUnreachable, VolcanoApiError, names_an_object

RETRIABLE_STATUS = frozenset({429, 500, 502, 503, 504})
# What an apiserver that is not serving (restarting, or not ready) answers, or a load balancer or proxy in
# front of it: as good as a lost connection.
UNAVAILABLE_STATUS = frozenset({500, 502, 503, 504})
# A restarting apiserver serves requests before its RBAC cache is warm and answers 401/403 for a
# moment: right after losing the connection (or an UNAVAILABLE_STATUS answer), those are retried too
# (never otherwise, so a missing permission still fails at once). Found by the chaos soak: behind a
# proxy, an apiserver restart answered 503, 500, then 403 for a list the identity may do.
AUTH_WARMUP_SECONDS = 30.0
# Credentials the apiserver accepted before and now refuses (401) have expired or are being
# rotated (a projected token file, an exec plugin's short-lived token), or the apiserver cannot check
# them for a while (its OIDC or webhook authenticator down): a waiter cannot see for that long, which
# is no reason to give up on a Job. They are read again and retried for this long; credentials never
# accepted in this hook fail after one re-reading, so a wrong token is said at once.
AUTH_REFUSED_SECONDS = 180.0
# The longest Retry-After honoured: an apiserver (or a proxy) asking for an hour must not park a task.
MAX_RETRY_AFTER_SECONDS = 30.0
# What a 404 means when a Call does not say (`Call.absent`): an error.
REQUIRED: Any = object()
ABSENT = "absent"  # what Attempts.after says of a 404 where the call gives `absent`


def api_error(error: BaseException) -> bool:
    """Whether `error` is either client's ApiException (an answer from the apiserver, or status 0)."""
    return isinstance(error, ApiException | AsyncApiException)


def status_of(error: BaseException) -> int | None:
    return int(getattr(error, "status", 0) or 0) if api_error(error) else None


def object_not_found(error: BaseException) -> bool:
    """A 404 in which the apiserver says the object does not exist. A 404 that names no object (the
    resource is not served: a CRD being upgraded) is not: it says nothing of the object."""
    return status_of(error) == 404 and names_an_object(error)


def refused_credentials(error: BaseException) -> bool:
    """A 401: the credentials are not (or no longer) valid, e.g. an expired token: worth reading again."""
    return status_of(error) == 401


def is_transient(error: BaseException) -> bool:
    """Errors worth another try: throttling, server errors, dropped or refused connections."""
    if api_error(error):
        return status_of(error) in RETRIABLE_STATUS or status_of(error) == 0
    return isinstance(error, Urllib3HTTPError | aiohttp.ClientError | ConnectionError | TimeoutError)


class ClientRetry(Urllib3Retry):
    """What urllib3 retries by itself under the sync hook's own retries: no refused connection (each of
    those would be 4 connections and 3 warnings) and no read that timed out (`calls.REQUEST_TIMEOUT`:
    urllib3 asked a silent apiserver three more times, holding a GET for 4 x 60 s before the hook could
    say anything). It still retries at once a reused connection the server had closed, which says nothing
    of the apiserver."""

    def increment(self, method: str | None = None, url: str | None = None, response: Any = None,
                  error: Exception | None = None, _pool: Any = None, _stacktrace: Any = None) -> Self:
        if isinstance(error, ReadTimeoutError):
            raise MaxRetryError(_pool, url or "", error) from error
        return super().increment(method, url, response, error, _pool, _stacktrace)


def short(error: BaseException) -> str:
    """An error in a few words for a log line: the HTTP status and reason of either client's
    ApiException (never its headers or body), else the exception's type and text."""
    if api_error(error):
        return f"HTTP {status_of(error)} {getattr(error, 'reason', '') or ''}".rstrip()
    if is_transient(error):
        return f"no answer: {unreachable_cause(error)}"
    return f"{type(error).__name__}: {str(error)[:200]}"


# The words a connection failure's text ends in, at any depth of urllib3's and aiohttp's wrapping:
# "[Errno 111] Connection refused", "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: ...".
_SOCKET_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)|\[SSL: \w+\] ([^'\")\]]+)")


def unreachable_cause(error: BaseException) -> str:
    """Why no answer came, in a few words: the socket's or TLS's own reason where the text has one."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:  # urllib3's MaxRetryError keeps the cause as `reason`
        seen.append(current)
        reason = getattr(current, "reason", None)
        current = reason if isinstance(reason, BaseException) else current.__cause__ or current.__context__
    for failure in reversed(seen):
        if found := _SOCKET_REASON.search(str(failure)):
            return (found[1] or f"TLS: {found[2]}").strip()
    innermost = seen[-1]
    return str(innermost)[:200] or type(innermost).__name__


def retry_after(error: BaseException) -> float | None:
    headers = getattr(error, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return None if seconds is None or seconds != seconds else max(0.0, seconds)


def retry_delay(error: BaseException, backoff: float) -> float:
    """How long to wait before retrying after `error`: the back-off, or the server's Retry-After if
    longer, capped at MAX_RETRY_AFTER_SECONDS. Both hooks wait (and log) exactly this."""
    return max(backoff, min(retry_after(error) or 0.0, MAX_RETRY_AFTER_SECONDS))


def backoff(attempt: int, base: float, cap: float, jitter: float) -> float:
    """The provider's one back-off curve: `base` doubling per attempt up to `cap`, spread by `jitter`
    in [0, 1) over the upper half (so many waiters do not retry in step, and none retries at once)."""
    ceiling = min(cap, base * 2 ** min(attempt, 16))
    return ceiling / 2 + jitter * ceiling / 2


def backoff_delays(attempts: int, base: float = 0.5, cap: float = 10.0, until: float | None = None) -> Iterator[float]:
    """The delays of one call's retries: `attempts` of them, and more until the monotonic time `until`
    if one is given."""
    attempt = 0
    while attempt < attempts or (until is not None and time.monotonic() < until):
        yield backoff(attempt, base, cap, random.random())
        attempt += 1


@dataclass(frozen=True)
class Retry:
    """What Attempts.after says of a failure worth another attempt: wait `delay` seconds, having read
    the credentials again first if `reload`."""

    delay: float
    reload: bool = False


class Attempts:
    """One API call's attempts. After each failure `after(error)` says: ABSENT (a 404 naming the object,
    where the call gives `absent`), or a Retry: after a 401 the credentials are read again (once at once; then, if the
    hook's credentials were accepted before, with back-off for up to AUTH_REFUSED_SECONDS), after a
    transient error the back-off (`retries` times or for `retry_for` seconds, the delay logged as
    waited). Anything else is raised, an API error as VolcanoApiError (never with its headers)."""

    def __init__(self, hook: Any, what: str, *, retry_for: float | None = None, if_absent: Any = REQUIRED) -> None:
        self.hook, self.what, self.if_absent = hook, what, if_absent
        self.started = time.monotonic()
        self.delays = backoff_delays(getattr(hook, "retries", 6),
                                     until=None if retry_for is None else time.monotonic() + retry_for)
        self.reloaded = False
        self.refused_delays: Iterator[float] | None = None  # the back-off of a 401 that stays

    def after(self, error: Exception) -> Retry | str:
        if self.if_absent is not REQUIRED and object_not_found(error):
            return ABSENT
        if refused_credentials(error):
            if not self.reloaded:
                self.reloaded = True
                return Retry(0.0, reload=True)
            if self.hook.credentials_accepted:
                if self.refused_delays is None:
                    self.refused_delays = backoff_delays(0, until=time.monotonic() + AUTH_REFUSED_SECONDS)
                if (delay := next(self.refused_delays, None)) is not None:
                    self.hook.log.warning("%s failed (%s): the credentials accepted before are refused; reading "
                                          "them again in %.1fs", self.what, short(error), delay)
                    return Retry(delay, reload=True)
        delay = next(self.delays, None) if self.hook.retriable(error) else None
        if delay is None:
            if api_error(error) and status_of(error) != 0:
                raise VolcanoApiError.from_api_exception(self.what, error, self.hook.server_address(),
                                                         self.hook.conn_id) from None
            if api_error(error) or is_transient(error):  # no answer (status 0: the client's own "no answer")
                raise ApiserverUnreachable(self.what, self.hook.conn_id, self.hook.server_address(),
                                           unreachable_cause(error), time.monotonic() - self.started) from None
            raise error
        delay = retry_delay(error, delay)
        self.hook.log.warning("%s failed (%s); retrying in %.1fs", self.what, short(error), delay)
        return Retry(delay)


class ConnectionLossAware:
    """Which errors are worth retrying, for both hooks: the transient ones, and 401/403 in the
    seconds after a connection was lost or the apiserver answered it was unavailable (a restarted
    apiserver warming its RBAC cache).

    The loss is remembered for the whole process: in a triggerer, the shared watch is often the
    only one to see the apiserver go away, and every trigger's next call may meet the cold cache."""

    _connection_lost_at: float = float("-inf")
    # The connections whose credentials the apiserver accepted in this process (a 401 after that is
    # retried longer: Attempts), whichever hook made the call. A trigger, or a task resumed after one,
    # says so before its first call: its connection created the Job.
    _accepted: ClassVar[set[str | None]] = set()
    conn_id: str | None

    def server_address(self) -> str | None:
        """The apiserver's address once the connection is loaded (either client's configuration)."""
        return getattr(getattr(self, "client_configuration", None), "host", None)

    @property
    def credentials_accepted(self) -> bool:
        return self.conn_id in ConnectionLossAware._accepted

    def note_connection_lost(self) -> None:
        ConnectionLossAware._connection_lost_at = time.monotonic()

    def note_credentials_accepted(self) -> None:
        ConnectionLossAware._accepted.add(self.conn_id)

    def retriable(self, error: BaseException) -> bool:
        if is_transient(error):
            if not api_error(error) or status_of(error) in UNAVAILABLE_STATUS:
                self.note_connection_lost()
            return True
        return (status_of(error) in (401, 403)
                and time.monotonic() - self._connection_lost_at < AUTH_WARMUP_SECONDS)
