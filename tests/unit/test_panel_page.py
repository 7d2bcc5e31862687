"""The panel's page (airflow_volcano/panel/static) in Chromium, its JSON answered here (Playwright's
routing, no server): an answer that never comes, or one the page cannot show, is said on the page,
which asks again; it never sits at "Loading the Volcano Job…" saying nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from airflow_volcano.panel.app import STATIC, _static
from tests.compose_stack import CHROMIUM, CHROMIUM_ARGS

PAGE = "http://panel.test/volcano-panel/ti/train/manual_1/fit/-1"
API = "http://panel.test/volcano-panel/api/ti/train/manual_1/fit/-1"


def served(name: str, media_type: str) -> Callable:
    """A route handler answering with the package's own static file."""
    return lambda route: route.fulfill(body=_static(name), content_type=media_type)


def handled(page, asked: list[str], count: int) -> None:
    """Lets Playwright run the route handlers of requests already made (it does so between calls)."""
    for _ in range(100):
        if len(asked) >= count:
            return
        page.wait_for_timeout(20)


@pytest.fixture
def panel_page() -> Iterator[Callable[[Callable], object]]:
    """Opens the page, on a clock the test drives, with `answer(route)` handling its JSON requests."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "Debian's chromium (make shellcheck installs it)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)

        def open_page(answer: Callable) -> object:
            page = browser.new_page()
            page.clock.install()
            page.route(PAGE, served("panel.html", "text/html"))
            for name, media_type in STATIC.items():
                page.route(f"http://panel.test/volcano-panel/static/{name}", served(name, media_type))
            page.route(f"{API}*", answer)
            page.goto(PAGE)
            return page

        try:
            yield open_page
        finally:
            browser.close()


def test_an_answer_that_never_comes_is_said_and_asked_again(panel_page):
    from playwright.sync_api import expect

    asked: list[str] = []
    page = panel_page(lambda route: asked.append(route.request.url))  # never fulfilled: no answer
    expect(page.locator("#status")).to_have_text("Loading the Volcano Job…")
    page.clock.fast_forward(31_000)
    expect(page.locator("#status")).to_have_text("The API server has not answered in 30 s; asking again.")
    with page.expect_request(f"{API}*"):  # the next refresh, 5 s on
        page.clock.fast_forward(6_000)
    handled(page, asked, 2)
    assert len(asked) == 2, asked


def test_an_answer_the_page_cannot_show_is_said_and_asked_again(panel_page):
    from playwright.sync_api import expect

    asked: list[str] = []

    def answer(route) -> None:
        asked.append(route.request.url)
        # A Job without its pods and timeline: not what the API server answers, but the page must say so.
        route.fulfill(body=json.dumps({"task": {"state": "running", "live": True},
                                       "job": {"namespace": "ml", "name": "fit", "phase": "Running"}}),
                      content_type="application/json")

    page = panel_page(answer)
    expect(page.locator("#status")).to_contain_text("The panel could not show the API server's answer (TypeError")
    with page.expect_request(f"{API}*"):  # the next refresh, 5 s on
        page.clock.fast_forward(6_000)
    expect(page.locator("#status")).to_contain_text("trying again")
    handled(page, asked, 2)
    assert len(asked) >= 2, asked
