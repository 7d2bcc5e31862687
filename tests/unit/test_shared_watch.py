"""The triggerer's shared Job watch driven by a scripted apiserver: what it does when the watch expires
or fails, and what it keeps in memory (pure asyncio, no cluster)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow_volcano.exceptions import VolcanoApiError, WatchExpired
from airflow_volcano.triggers import job_watch
from airflow_volcano.triggers.job_watch import WATCH_BROKEN, SharedJobWatch


def job(name: str, version: int, phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "resourceVersion": str(version)},
            "status": {"state": {"phase": phase}}}


class ScriptedHook:
    """An AsyncVolcanoHook whose watch does what `watches` say, one entry per watch request:
    a list of (kind, Job) events, or an exception to raise."""

    def __init__(self, jobs: list[dict], watches: list[Any]) -> None:
        self.jobs, self.watches = jobs, watches
        self.lists, self.reloads, self.opened = 0, 0, []

    def shared_client(self) -> Any:
        hook = self

        class Shared:
            async def __aenter__(self) -> ScriptedHook:
                return hook

            async def __aexit__(self, *exc: object) -> None:
                return None

        return Shared()

    async def reload_credentials(self) -> None:
        self.reloads += 1

    async def list_page(self, resource: str, namespace: str, **kwargs: Any) -> tuple[list[dict], str, None]:
        self.lists += 1
        return list(self.jobs), "100", None

    async def watch(self, resource: str, namespace: str, **kwargs: Any) -> AsyncIterator[tuple[str, dict]]:
        self.opened.append(time.monotonic())
        step = self.watches.pop(0) if self.watches else []
        if isinstance(step, BaseException):
            raise step
        for event in step:
            yield event
        await asyncio.sleep(3600)  # an open watch with nothing to say


def watch_with(hook: ScriptedHook) -> SharedJobWatch:
    watch = SharedJobWatch("kubernetes_default", "ml")
    watch._hook = hook
    return watch


def test_a_410_every_time_lists_again_after_a_growing_back_off_not_in_a_loop():
    hook = ScriptedHook([job("a", 1)], [WatchExpired("gone")] * 100)

    async def scenario() -> None:
        watch = watch_with(hook)
        async with watch.subscribe("a"):
            await asyncio.sleep(3)

    asyncio.run(scenario())
    assert 2 <= hook.lists <= 6, f"{hook.lists} lists in 3 s"


def test_a_refused_watch_fails_no_wait_and_the_credentials_are_read_again():
    """An expired token: the watch's 401 reaches no subscriber; the watch reloads the credentials,
    lists again and hands each subscriber its Job as it is now."""
    refused = VolcanoApiError("watch jobs in ml", 401, "Unauthorized")
    hook = ScriptedHook([job("a", 1)], [refused, [("MODIFIED", job("a", 5, "Completed"))]])

    async def scenario() -> list[Any]:
        watch = watch_with(hook)
        seen = []
        async with watch.subscribe("a") as changes:
            while not seen or seen[-1]["status"]["state"]["phase"] != "Completed":
                seen.append(await asyncio.wait_for(changes.get(), 10))
        return seen

    seen = asyncio.run(scenario())
    assert all(isinstance(item, dict) for item in seen), seen
    assert seen[-1]["metadata"]["resourceVersion"] == "5"
    assert hook.reloads == 1 and hook.lists == 2


def test_a_watch_that_keeps_failing_tells_its_subscribers_to_read_on_their_own():
    refused = VolcanoApiError("watch jobs in ml", 403, "Forbidden")
    hook = ScriptedHook([job("a", 1)], [refused] * 100)

    async def scenario() -> list[Any]:
        watch = watch_with(hook)
        got = []
        async with watch.subscribe("a") as changes:
            while WATCH_BROKEN not in got:
                got.append(await asyncio.wait_for(changes.get(), 10))
        return got

    got = asyncio.run(scenario())
    assert got[-1] == WATCH_BROKEN and not any(isinstance(item, BaseException) for item in got)


def test_the_watch_keeps_only_the_jobs_someone_waits_on(monkeypatch):
    monkeypatch.setattr(job_watch, "LIST_GRACE_SECONDS", 0.2)
    hook = ScriptedHook([job("mine", 1), *(job(f"other-{index}", index) for index in range(500))], [])

    async def scenario() -> tuple[int, set[str], set[str]]:
        watch = watch_with(hook)
        async with watch.subscribe("mine"):
            during_grace = len(watch.latest)
            await asyncio.sleep(0.3)
            watch.item("MODIFIED", job("other-1", 2000, "Completed"))  # someone else's Job changes
            watch.item("MODIFIED", job("mine", 2001))
            after_grace = set(watch.latest)
        return during_grace, after_grace, set(watch.latest)

    during_grace, after_grace, after_leaving = asyncio.run(scenario())
    assert during_grace == 501, "a trigger starting meanwhile begins from the list, without a GET of its own"
    assert after_grace == {"mine"}
    assert after_leaving == set(), "nobody waits any more"
