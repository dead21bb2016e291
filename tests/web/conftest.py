"""Browser-test fixtures: a daphne (ASGI) server on the test database, and headless Chromium.

The server is a real daphne subprocess against the test PostgreSQL database and Redis (db 15,
the channel layer and cache of the suite), so websockets, sessions and static files behave as in
production. Data is created with `transactional_db`, so the server sees it.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from portal.web.asgi_process import ROOT, daphne_start, daphne_stop, free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture
def portal_env() -> dict[str, str]:
    """Extra environment variables for the portal server (a test module may override this)."""
    return {}


@pytest.fixture
def asgi_server(transactional_db, request, portal_env):
    """Base URL of a daphne server running the portal against the test database."""
    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    env = (
        os.environ
        | {
            "DJANGO_SETTINGS_MODULE": "portal.settings_test",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "REDIS_URL": settings.REDIS_URL,
            "DEBUG": "1",
        }
        | portal_env
    )
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / f"daphne-{request.node.name}.log", "wb") as log:
        process = daphne_start(port=port, env=env, log=log)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            daphne_stop(process)


@pytest.fixture(scope="module")
def chromium():
    """Headless Chromium for one module of tests.

    Playwright's sync API keeps an event loop running in the test thread, so while it lives the
    ORM needs DJANGO_ALLOW_ASYNC_UNSAFE and anything using async_to_sync goes through in_thread().
    """
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


def in_thread(function, *args, **kwargs):
    """Run `function` off the browser's event loop (channel-layer sends, services that broadcast)."""
    from django.db import connection

    def call():
        try:
            return function(*args, **kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


@pytest.fixture
def browser_page(chromium, request):
    """A fresh desktop-sized page; page errors and CSP violations fail the test. Its last view
    is saved."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # The live view swaps fragments in: they must keep to the Content-Security-Policy too.
    page.on("console", lambda m: "Content Security Policy" in m.text and errors.append(m.text))
    page.set_default_timeout(10_000)
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"last-{request.node.name}.png"), full_page=True)
    context.close()
    assert errors == []


def wait_for(page, expression: str, timeout_s: float = 10.0) -> None:
    """Wait until a JS expression holds, like page.wait_for_function, without eval in the page.

    Playwright's wait_for_function compiles its predicate inside the page, which the site's
    Content-Security-Policy (no 'unsafe-eval') refuses; page.evaluate goes through the debugger.
    """
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {expression}")
        page.wait_for_timeout(100)


def sign_in(page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")


# axe-core impacts that fail a page; "moderate" and "minor" are reported by axe but let through.
AXE_FAILING = ("serious", "critical")


def assert_accessible(page, *, label: str = "") -> None:
    """Run axe-core (bundled by axe-playwright-python, injected through the debugger, so the
    page's Content-Security-Policy does not stand in the way) on the page as it stands now;
    fail on any serious or critical violation, naming the rule and the elements."""
    from axe_playwright_python.sync_playwright import Axe

    violations = Axe().run(page).response["violations"]
    failing = [v for v in violations if v["impact"] in AXE_FAILING]
    lines = [
        f"{label or page.url}: {v['id']} ({v['impact']}) {v['help']}: "
        + "; ".join(" ".join(node["target"]) + " " + node["html"][:160] for node in v["nodes"][:5])
        for v in failing
    ]
    assert not failing, "\n".join(lines)
