"""The web dashboard in a real headless Chromium (Debian's, driven by Playwright): log in by
the one-time link `gpulayer dashboard` prints, watch a running job's logs arrive live, cancel
it and see its state change; a read-only token logged in through the form sees no cancel
button and cannot cancel. Screenshots go to target/screenshots/ for review."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import Server

SCREENSHOTS = Path(__file__).resolve().parents[2] / "target" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get("GPULAYER_TEST_REQUIRE_BROWSER") == "1"

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - scripts/test installs it
    sync_playwright = None

if (CHROMIUM is None or sync_playwright is None) and not REQUIRED:
    pytest.skip("Chromium or playwright is missing (scripts/test installs both)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM is not None, "chromium is not installed (scripts/test installs it)"
    assert sync_playwright is not None, "playwright is not installed (scripts/test installs it)"
    # Chromium refuses to sandbox itself as root (CI runs as root).
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield b
        b.close()


def token(server: Server, role: str, name: str) -> str:
    out = server.cli("token", "create", "--role", role, "--name", name, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["secret"]


def as_token(server: Server, secret: str, *args: str):
    env = dict(server.env, GPULAYER_URL=server.url, GPULAYER_TOKEN=secret)
    import subprocess

    from conftest import BIN

    return subprocess.run([BIN, *args], env=env, capture_output=True, text=True)


def submit_ticker(server: Server, secret: str) -> int:
    """A job that prints a numbered line every 0.3 s until it is stopped."""
    out = as_token(server, secret, "submit", "--json", "--name", "ticker", "--",
                   sys.executable, "-u", "-c",
                   "import time\nfor i in range(10**6):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.3)")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["id"]


def context(browser, server: Server):
    # The server's certificate is self-signed; the browser is told to accept it, as a person
    # accepts it once. (Its cookies are still Secure: the page is https.)
    return browser.new_context(ignore_https_errors=True, viewport={"width": 1400, "height": 900})


def test_a_submitter_opens_the_dashboard_by_link_watches_live_logs_and_cancels(server: Server, browser) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    secret = token(server, "submitter", "agent-claude")
    job = submit_ticker(server, secret)
    out = as_token(server, secret, "dashboard", "--no-browser", "--json")
    assert out.returncode == 0, out.stderr
    link = json.loads(out.stdout)
    assert link["opened"] is False and link["url"].startswith(server.url + "/dashboard/login?code=")

    ctx = context(browser, server)
    page = ctx.new_page()
    page.goto(link["url"])
    expect(page).to_have_url(server.url + "/dashboard/jobs")
    expect(page.locator("#viewer")).to_have_text("agent-claude")
    row = page.locator(f"#job-{job}")
    expect(row.locator(".by")).to_have_text("agent-claude")
    cookies = {c["name"]: c for c in ctx.cookies()}
    session = cookies["gpulayer_session"]
    assert session["httpOnly"] and session["secure"] and session["sameSite"] == "Strict", session
    # The leader counts the queue when it takes the lead: the pictures are there.
    page.reload()
    expect(page.locator("#queue-chart svg polyline")).to_have_count(2)
    expect(page.locator("#finished-chart svg rect.bar")).to_have_count(60)
    page.screenshot(path=str(SCREENSHOTS / "jobs.png"), full_page=True)

    # The link works once.
    again = ctx.new_page()
    again.goto(link["url"])
    expect(again.locator("#login-error")).to_contain_text("used already or has expired")
    again.close()

    row.locator("a").first.click()
    expect(page).to_have_url(f"{server.url}/dashboard/jobs/{job}")
    logs = page.locator("#logs")
    expect(logs).to_contain_text("tick 2", timeout=30_000)
    shown = logs.inner_text().count("tick")
    # Lines keep arriving over the websocket while the page stays as it is.
    expect(logs).to_contain_text(f"tick {shown + 3}", timeout=30_000)
    expect(page.locator("#logs-status")).to_have_text("following live")
    page.screenshot(path=str(SCREENSHOTS / "job-live-logs.png"), full_page=True)

    page.locator("#cancel").click()
    expect(page.locator("#job-state")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#cancel")).to_have_count(0)
    expect(page.locator("#timeline")).to_contain_text("cancelled")
    page.screenshot(path=str(SCREENSHOTS / "job-cancelled.png"), full_page=True)
    ctx.close()


def test_a_read_only_token_logged_in_by_the_form_sees_no_cancel_button_and_cannot_cancel(server: Server, browser) -> None:
    submitter = token(server, "submitter", "ci-bot")
    reader = token(server, "read-only", "watcher")
    job = submit_ticker(server, submitter)
    ctx = context(browser, server)
    page = ctx.new_page()
    page.goto(server.url + "/dashboard/jobs")
    expect(page).to_have_url(server.url + "/dashboard/login")

    page.fill("#token", "glr_not-a-real-token")
    page.click("#login")
    expect(page.locator("#login-error")).to_contain_text("not known to the server")

    page.fill("#token", reader)
    page.click("#login")
    expect(page).to_have_url(server.url + "/dashboard/jobs")
    expect(page.locator("#viewer")).to_have_text("watcher")
    page.goto(f"{server.url}/dashboard/jobs/{job}")
    expect(page.locator("#job-state")).not_to_have_text("pending", timeout=30_000)
    expect(page.locator("#logs")).to_contain_text("tick", timeout=30_000)
    expect(page.locator("#cancel")).to_have_count(0)

    # A forged cancel with this session's own CSRF value is refused for the role.
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    answer = page.request.post(f"{server.url}/dashboard/jobs/{job}/cancel", form={"csrf": csrf},
                               max_redirects=0)
    assert answer.status == 403, answer.status
    # Without the CSRF value, refused before the role is even looked at.
    answer = page.request.post(f"{server.url}/dashboard/jobs/{job}/cancel", form={"csrf": "x"},
                               max_redirects=0)
    assert answer.status == 403, answer.status
    state = json.loads(server.cli("status", str(job), "--json").stdout)["state"]
    assert state in ("assigned", "running"), state
    page.goto(server.url + "/dashboard/workers")
    expect(page.locator("section.worker")).to_have_count(1)
    # The picture of the worker's slots shows the running ticker as a held bar named by job.
    titles = page.locator("figure.occupancy svg rect.held title").all_text_contents()
    assert any(f"job {job} (running)" in t for t in titles), titles
    page.screenshot(path=str(SCREENSHOTS / "workers.png"), full_page=True)
    ctx.close()
    server.cli("cancel", str(job))


def test_the_dashboard_refuses_requests_from_other_sites_and_worker_tokens(server: Server) -> None:
    ctx = server.ssl_context()

    def post(path: str, data: dict, headers: dict) -> int:
        req = urllib.request.Request(server.url + path, data=urllib.parse.urlencode(data).encode(),
                                     headers=headers, method="POST")
        try:
            return urllib.request.urlopen(req, context=ctx).status
        except urllib.error.HTTPError as e:
            return e.code

    # The login form's CSRF cookie must match its field.
    assert post("/dashboard/login", {"token": server.token, "csrf": "a"},
                {"Cookie": "gpulayer_login=b"}) == 403
    # A form posted from another site is refused even with matching values.
    assert post("/dashboard/login", {"token": server.token, "csrf": "a"},
                {"Cookie": "gpulayer_login=a", "Origin": "https://evil.example"}) == 403
    # A worker token cannot open the dashboard.
    assert post("/dashboard/login", {"token": server.join_token, "csrf": "a"},
                {"Cookie": "gpulayer_login=a"}) == 403
    # Pages without a session go to the login form.
    req = urllib.request.Request(server.url + "/dashboard/workers")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=ctx))
    try:
        opener.open(req)
        raise AssertionError("no redirect")
    except urllib.error.HTTPError as e:
        assert e.code == 303 and e.headers["location"] == "/dashboard/login"
