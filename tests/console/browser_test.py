#!/usr/bin/env python3
"""The web console in a real browser: Debian's Chromium, driven by Selenium, against a real
outboxd (`outboxd serve --console-listen ...`) on PostgreSQL.

What it does, in order (each step prints a line; the first failure ends the run with a message
that says what was expected and what the page showed, exit status 1):

1. Signing in: without a session every page redirects (303) to /login; a wrong token gets a 401
   page with #login-error; the admin token signs in, and the session cookie is HttpOnly and
   SameSite=Strict. The pages name an icon, which is served.
2. A consumer's backlog grows and shrinks: consumer `console-demo` on `orders.*` (max_deliveries
   1) is created over gRPC, its overview row showing dashes for rates not sampled yet and 0
   acked; 20 messages are enqueued with no stream attached and the overview's row reaches a
   backlog of 20 by itself (the table refreshes every 10 s); a subscriber acks 10 and stops, the
   backlog falls to 10 and the acked figure rises to 10. The consumer's pending list (from its
   page) holds the 10 left, its in-flight list none.
3. Messages fail: 5 messages of type `Broken` are nacked with `card "declined"` (dead at once);
   the overview's acked figure reaches 20; the consumer page shows one dead group with that
   error as it is, count 5. Pause and resume through the page's buttons reach the consumer
   (checked over gRPC).
4. CSRF: POSTs without the `csrf` field (or with a wrong one) are refused with 403 and change
   nothing (checked over gRPC), from the browser's own fetch and from a copied cookie; a form
   whose token no longer counts (as after a restart) leads to a styled refusal page whose way
   back returns to the form's page.
5. A held key: consumer `console-keys` (dead key policy hold) holds key `sku-1` after its first
   message dead-letters; "Skip it" shows a confirmation first (the key still held), then the
   consumer page says what it did, and the waiting message is delivered.
6. A read-only principal (admin:read) sees the dead group but no pause, resume, dry-run or
   message replay form, and its POSTs are refused with or without the token; a principal with
   replay:* but no tail: sees the dry-run forms and no payload (#payload-hidden, and the
   payload's text nowhere).
7. A deep link: a fresh browser opening a message's page is sent to sign in and, signed in,
   lands on that message; a sign-in whose next page names another site (`//host`, a backslash,
   a scheme, a tab) lands on the overview of this console.
8. Dry run and replay: the dry run selects 5 and changes nothing; the replay (max_per_second 50)
   runs to `done` on its progress page; a subscriber receives those 5 messages again with
   delivery_count 1 and acks them. The error shows as it is on the dry run, the progress page
   and the replays list.
9. The message page (payload with its keys in their order, headers, timeline), one message
   replayed from it (a confirmation, then a message after, and the message delivered again),
   search (by type, by topic following `a#next`, by id, by topic pattern), the replays list,
   and signing out.

Screenshots of each screen go to SCREENSHOT_DIR: overview.png, deliveries.png, consumer.png,
dry-run.png, replay.png, message.png, search.png, replays.png (the documentation shows them). On a failure, a
screenshot and the page's HTML go to FAILURE_DIR (default: a new temporary directory).

Environment: CONSOLE_URL (http://host:port of the console), OUTBOXD_ADDR (gRPC host:port,
plaintext), ADMIN_TOKEN (every permission), READER_TOKEN (admin:read only), NOTAIL_TOKEN
(admin:read and replay:*, no tail:), SCREENSHOT_DIR; optional ADMIN_PRINCIPAL (the admin token's
principal name, default `admin`), CHROMIUM (default /usr/bin/chromium), CHROMEDRIVER (default
/usr/bin/chromedriver), FAILURE_DIR, WAIT_SECONDS (default 30: the bound of every wait).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urlparse

import grpc
import requests
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

import outboxd

# Selenium Manager must not try to fetch a browser or a driver: both are Debian's.
os.environ.setdefault("SE_OFFLINE", "true")

T = TypeVar("T")


def env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        print(f"CONSOLE BROWSER TEST FAILED: the environment variable {name} is not set", flush=True)
        sys.exit(2)
    return value


CONSOLE_URL = env("CONSOLE_URL").rstrip("/")
OUTBOXD_ADDR = env("OUTBOXD_ADDR").removeprefix("http://")
ADMIN_TOKEN = env("ADMIN_TOKEN")
READER_TOKEN = env("READER_TOKEN")
NOTAIL_TOKEN = env("NOTAIL_TOKEN")
SCREENSHOT_DIR = Path(env("SCREENSHOT_DIR"))
ADMIN_PRINCIPAL = env("ADMIN_PRINCIPAL", "admin")
CHROMIUM = env("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = env("CHROMEDRIVER", "/usr/bin/chromedriver")
FAILURE_DIR = Path(os.environ.get("FAILURE_DIR") or tempfile.mkdtemp(prefix="console-browser-failure-"))
WAIT = float(os.environ.get("WAIT_SECONDS", "30"))

CONSUMER = "console-demo"
GOOD_TOPIC = "orders.created"
BROKEN_TOPIC = "orders.charged"
BROKEN_TYPE = "Broken"
# Quoted, as errors often are: every screen shows it as it is, never backslashed.
ERROR = 'card "declined"'
# A consumer that holds an ordering key when a message of it dead-letters.
KEYS_CONSUMER = "console-keys"
KEYS_TOPIC = "stock.reserved"
KEY = "sku-1"
KEYS_ERROR = 'stock "sku-1" gone'

# In every Broken payload: the principal without tail: must not see it anywhere on a page.
SECRET = "pan-4111-1111-1111-1111"


class Failed(Exception):
    """A check that did not hold; its text is the whole explanation."""


class Missing(Failed):
    """An element that is not on the page (yet: a wait keeps polling)."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise Failed(message)


def step(text: str) -> None:
    print(f"== {text}", flush=True)


def first_int(text: str | None) -> int | None:
    """The first integer in a cell's text ("20", "1,024", "20 messages"), or None."""
    if text is None:
        return None
    m = re.search(r"-?\d[\d,\u202f\u00a0_]*", text)
    if not m:
        return None
    return int(re.sub(r"[^\d-]", "", m.group(0)))


def wait_for(what: str, observe: Callable[[], T], ok: Callable[[T], bool], timeout: float = WAIT,
             every: float = 0.25, between: Callable[[], None] | None = None) -> T:
    """Polls `observe` until `ok` holds of what it returns, at most `timeout` seconds; a missing
    or replaced element (or any WebDriver error in between pages) counts as not yet. `between`
    runs between polls (a reload, for pages that do not refresh themselves). Fails naming `what`
    and the last thing seen."""
    deadline = time.monotonic() + timeout
    last = "nothing yet"
    while True:
        try:
            value = observe()
            last = repr(value)
            if ok(value):
                return value
        except (WebDriverException, Missing) as e:
            # Not there yet, replaced by a refresh, or a node of the page being left: poll again.
            last = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if time.monotonic() >= deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {last}")
        time.sleep(every)
        if between is not None:
            between()


# ---- gRPC: consumers, messages, subscribers ----------------------------------------------------

def auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


class Grpc:
    """What the test does over gRPC, as the admin principal: the repository's Python client for
    the admin API and subscribers, the generated stub for `Outbox.Enqueue`."""

    def __init__(self) -> None:
        self.admin = outboxd.AdminClient(OUTBOXD_ADDR, token=ADMIN_TOKEN)
        self.channel = grpc.insecure_channel(OUTBOXD_ADDR)
        self.outbox = outboxd.pb.outbox_grpc.OutboxStub(self.channel)

    def close(self) -> None:
        self.admin.close()
        self.channel.close()

    def enqueue(self, topic: str, type_: str, payload: dict[str, Any], ordering_key: str = "") -> str:
        req = outboxd.pb.outbox.EnqueueRequest(topic=topic, type=type_, payload=json.dumps(payload).encode(),
                                               headers={"content-type": "application/json", "source": "console-test"},
                                               ordering_key=ordering_key)
        return str(self.outbox.Enqueue(req, metadata=auth(ADMIN_TOKEN), timeout=30).message_id)

    def stats(self) -> outboxd.ConsumerStats:
        return self.admin.get_stats(CONSUMER).consumers[0]

    def paused(self) -> bool:
        return bool(self.admin.get_consumer(CONSUMER).paused)


async def ack_some(n: int) -> list[str]:
    """Attaches a subscriber that acks `n` deliveries, one at a time, then stops."""
    acked: list[str] = []

    async def handle(d: outboxd.Delivery) -> None:
        acked.append(d.message_id)
        if len(acked) >= n:
            subscriber.stop()  # this handler still finishes, and its ack is sent

    subscriber = outboxd.Subscriber(OUTBOXD_ADDR, CONSUMER, handle, concurrency=1, token=ADMIN_TOKEN)
    await asyncio.wait_for(subscriber.run(), WAIT * 2)
    return acked


async def fail_broken(expected_dead: int) -> tuple[set[str], int]:
    """Attaches a subscriber that nacks every `Broken` delivery with ERROR (dead at once: the
    consumer allows one delivery) and acks the rest, until the consumer has `expected_dead` dead
    and nothing due or leased. Returns the nacked ids and how many it acked."""
    nacked: set[str] = set()
    acked = 0

    async def handle(d: outboxd.Delivery) -> None:
        nonlocal acked
        if d.type == BROKEN_TYPE:
            nacked.add(d.message_id)
            raise RuntimeError(ERROR)
        acked += 1

    # The subscriber logs each nack with its traceback: expected here, so kept out of the output.
    log = logging.getLogger("outboxd.subscriber")
    level = log.level
    log.setLevel(logging.ERROR)
    subscriber = outboxd.Subscriber(OUTBOXD_ADDR, CONSUMER, handle, concurrency=4, token=ADMIN_TOKEN)
    task = asyncio.create_task(subscriber.run())
    try:
        async with outboxd.AdminClient(OUTBOXD_ADDR, token=ADMIN_TOKEN) as admin:
            deadline = time.monotonic() + WAIT * 2
            while True:
                s = (await admin.get_stats(CONSUMER)).consumers[0]
                if s.dead >= expected_dead and s.backlog == 0 and s.in_flight == 0:
                    break
                if task.done():
                    task.result()
                    raise Failed("the failing subscriber stopped before the messages were dead")
                if time.monotonic() >= deadline:
                    raise Failed(f"the consumer did not reach {expected_dead} dead with nothing due within "
                                 f"{WAIT * 2:.0f} s: {s}")
                await asyncio.sleep(0.2)
    finally:
        subscriber.stop()
        await asyncio.wait_for(task, WAIT)
        log.setLevel(level)
    return nacked, acked


async def hold_key(first: str) -> None:
    """Attaches a subscriber to KEYS_CONSUMER that nacks `first` with KEYS_ERROR (dead at once:
    one delivery allowed), until the consumer holds its key, and takes nothing else."""
    async def handle(d: outboxd.Delivery) -> None:
        check(d.message_id == first, f"{KEYS_CONSUMER} delivered {d.message_id} while its key should be held")
        raise RuntimeError(KEYS_ERROR)

    log = logging.getLogger("outboxd.subscriber")
    level = log.level
    log.setLevel(logging.ERROR)
    subscriber = outboxd.Subscriber(OUTBOXD_ADDR, KEYS_CONSUMER, handle, concurrency=1, token=ADMIN_TOKEN)
    task = asyncio.create_task(subscriber.run())
    try:
        async with outboxd.AdminClient(OUTBOXD_ADDR, token=ADMIN_TOKEN) as admin:
            deadline = time.monotonic() + WAIT * 2
            while True:
                s = (await admin.get_stats(KEYS_CONSUMER)).consumers[0]
                if s.dead == 1 and s.held_keys == 1:
                    break
                if task.done():
                    task.result()
                    raise Failed(f"the subscriber of {KEYS_CONSUMER} stopped before its key was held")
                if time.monotonic() >= deadline:
                    raise Failed(f"{KEYS_CONSUMER} did not hold its key within {WAIT * 2:.0f} s: {s}")
                await asyncio.sleep(0.2)
    finally:
        subscriber.stop()
        await asyncio.wait_for(task, WAIT)
        log.setLevel(level)


async def receive(consumer: str, expected: set[str]) -> dict[str, outboxd.Delivery]:
    """Attaches a subscriber to `consumer` that acks what it gets until it has had every id of
    `expected`."""
    got: dict[str, outboxd.Delivery] = {}

    async def handle(d: outboxd.Delivery) -> None:
        got[d.message_id] = d
        if expected <= set(got):
            subscriber.stop()

    subscriber = outboxd.Subscriber(OUTBOXD_ADDR, consumer, handle, concurrency=len(expected), token=ADMIN_TOKEN)
    try:
        await asyncio.wait_for(subscriber.run(), WAIT * 2)
    except TimeoutError as e:
        raise Failed(f"{consumer}: the messages did not all arrive within {WAIT * 2:.0f} s: got "
                     f"{sorted(got)}, expected {sorted(expected)}") from e
    return got


async def receive_replayed(expected: set[str]) -> dict[str, outboxd.Delivery]:
    """Attaches a subscriber that acks what it gets until it has had every id of `expected`."""
    got: dict[str, outboxd.Delivery] = {}

    async def handle(d: outboxd.Delivery) -> None:
        got[d.message_id] = d
        if expected <= set(got):
            subscriber.stop()

    subscriber = outboxd.Subscriber(OUTBOXD_ADDR, CONSUMER, handle, concurrency=len(expected), token=ADMIN_TOKEN)
    try:
        await asyncio.wait_for(subscriber.run(), WAIT * 2)
    except TimeoutError as e:
        raise Failed(f"the replayed messages did not all arrive within {WAIT * 2:.0f} s: got "
                     f"{sorted(got)}, expected {sorted(expected)}") from e
    return got


# ---- the browser -------------------------------------------------------------------------------

def new_browser() -> WebDriver:
    check(Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium chromium-driver")
    check(Path(CHROMEDRIVER).exists(), f"{CHROMEDRIVER} is missing: apt-get install chromium-driver")
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root, in CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        # No connections of its own: the network is closed here, and the screenshots stay clean.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--disable-extensions",
        "--no-first-run",
        "--no-default-browser-check",
        f"--user-data-dir={tempfile.mkdtemp(prefix='console-chromium-')}",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_window_size(1280, 900)
    # The page itself 1280x900 too (headless Chromium takes the window's frame off the viewport),
    # so that every screenshot has that size.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    driver.set_page_load_timeout(WAIT)
    return driver


class Browser:
    """One signed-in (or not yet) browser session of one principal."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.driver = new_browser()

    def quit(self) -> None:
        try:
            self.driver.quit()
        except WebDriverException:
            pass

    # navigation and lookups

    def get(self, path: str) -> None:
        self.driver.get(CONSOLE_URL + path)

    def path(self) -> str:
        return urlparse(self.driver.current_url).path

    def text_of(self, elements: list[WebElement]) -> list[str]:
        return [str(e.text).strip() for e in elements]

    def one(self, css: str, within: WebElement | None = None) -> WebElement:
        try:
            return (within or self.driver).find_element(By.CSS_SELECTOR, css)
        except NoSuchElementException as e:
            raise Missing(f"{self.who}: no `{css}` on {self.path()}") from e

    def all(self, css: str, within: WebElement | None = None) -> list[WebElement]:
        return (within or self.driver).find_elements(By.CSS_SELECTOR, css)

    def absent(self, css: str, why: str) -> None:
        found = self.all(css)
        check(not found, f"{self.who}: {self.path()} has `{css}` ({len(found)}), but {why}")

    def text(self, css: str, within: WebElement | None = None) -> str:
        return str(self.one(css, within).text).strip()

    def expect(self, css: str, ok: Callable[[str], bool], expected: str, within: WebElement | None = None) -> str:
        """The text of `css`, which must satisfy `ok`; `expected` says how, in the failure."""
        text = self.text(css, within)
        check(ok(text), f"{self.who}: `{css}` on {self.path()} reads {text!r}, expected {expected}")
        return text

    def wait_path(self, pattern: str, what: str) -> re.Match[str]:
        m = wait_for(f"{self.who}: {what} (a URL path matching {pattern})",
                     lambda: re.fullmatch(pattern, self.path()) and self.path(), bool)
        return re.fullmatch(pattern, m)  # type: ignore[arg-type,return-value]

    def csrf(self) -> str:
        token = self.one('meta[name="csrf-token"]').get_attribute("content") or ""
        check(token, f"{self.who}: the csrf-token meta tag of {self.path()} is empty")
        return token

    def chrome(self) -> None:
        """What every signed-in page has: the CSRF meta tag, the nav, the sign-out form."""
        self.csrf()
        for css in ("a#nav-overview", "a#nav-search", "a#nav-replays", "form#sign-out"):
            self.one(css)

    def cookies(self) -> dict[str, str]:
        return {c["name"]: c["value"] for c in self.driver.get_cookies()}

    def screenshot(self, name: str) -> None:
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        # Let the last htmx swap and the fonts settle.
        time.sleep(0.3)
        check(self.driver.save_screenshot(str(SCREENSHOT_DIR / name)), f"could not write {SCREENSHOT_DIR / name}")
        print(f"   screenshot {SCREENSHOT_DIR / name}", flush=True)

    def keep_failure(self, label: str) -> None:
        try:
            FAILURE_DIR.mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(FAILURE_DIR / f"{label}.png"))
            (FAILURE_DIR / f"{label}.html").write_text(self.driver.page_source)
            print(f"   {self.who}'s page at the failure ({self.driver.current_url}): "
                  f"{FAILURE_DIR / label}.png and .html", flush=True)
            body = self.driver.find_element(By.TAG_NAME, "body").text
            print("   its text: " + body[:1500].replace("\n", " | "), flush=True)
        except Exception as e:  # noqa: BLE001 - the report of a failure must not hide it
            print(f"   (could not keep {self.who}'s page: {e})", flush=True)

    # actions

    def sign_in(self, token: str, landing: str = r"/") -> None:
        """Signs in on the sign-in page (the one shown now, when it is; else /login) and waits
        for the page it leads to (`landing`, a path pattern)."""
        if self.path() != "/login":
            self.get("/login")
        field = self.one("input#token")
        check(field.get_attribute("name") == "token", f"{self.who}: input#token is not named `token`")
        field.clear()
        field.send_keys(token)
        self.one("button#sign-in").click()
        self.wait_path(landing, f"{landing} after signing in")
        self.chrome()

    def fetch_post(self, path: str, fields: dict[str, str]) -> int | str:
        """A POST from the page itself (same origin, the browser's cookie), as a script on the
        console's origin could send it; returns the status (0: a redirect, not followed)."""
        script = """
            const done = arguments[arguments.length - 1];
            fetch(arguments[0], {method: 'POST', body: new URLSearchParams(arguments[1]),
                                 credentials: 'same-origin', redirect: 'manual'})
              .then(r => done(r.type === 'opaqueredirect' ? 0 : r.status))
              .catch(e => done('error: ' + e));
        """
        self.driver.set_script_timeout(WAIT)
        return self.driver.execute_async_script(script, CONSOLE_URL + path, fields)  # type: ignore[no-any-return]

    def post(self, path: str, fields: dict[str, str]) -> requests.Response:
        """A form POST with this session's cookies copied into another HTTP client (a form even
        when `fields` is empty, as a forged form would be)."""
        return requests.post(CONSOLE_URL + path, data=urlencode(fields), cookies=self.cookies(),
                             headers={"content-type": "application/x-www-form-urlencoded"},
                             allow_redirects=False, timeout=WAIT)


# ---- page readers ------------------------------------------------------------------------------

def overview_cell(b: Browser, cell: str) -> str:
    return b.text(f'table#consumers tr[data-consumer="{CONSUMER}"] td.{cell}')


def wait_overview(b: Browser, cell: str, want: int, why: str) -> None:
    """Waits for the overview's own refresh (no reload) to show `want` in the row's `cell`."""
    check(b.path() == "/", f"{b.who}: expected to be on the overview, at {b.path()}")
    wait_for(f"{b.who}: the overview's {cell} of {CONSUMER} to read {want} ({why}); the table refreshes itself",
             lambda: overview_cell(b, cell), lambda t: first_int(t) == want)


def dead_group(b: Browser, error: str) -> WebElement | None:
    for row in b.all("table#dead-groups tr.dead-group"):
        if b.text("td.error", row) == error:
            return row
    return None


def wait_dead_group(b: Browser, count: int) -> WebElement:
    def observe() -> tuple[str, ...] | WebElement:
        row = dead_group(b, ERROR)
        if row is None:
            return tuple(b.text("td.error", r) for r in b.all("table#dead-groups tr.dead-group"))
        return row

    def ok(v: object) -> bool:
        return isinstance(v, WebElement) and first_int(b.text("td.count", v)) == count

    row = wait_for(f"{b.who}: a dead group `{ERROR}` with count {count} on {b.path()}", observe, ok,
                   between=b.driver.refresh, every=1.0)
    assert isinstance(row, WebElement)
    return row


def result_ids(b: Browser) -> list[str]:
    return [r.get_attribute("data-message-id") or "" for r in b.all("table#results tr[data-message-id]")]


# ---- the scenario ------------------------------------------------------------------------------

class State:
    broken: list[str]
    good: list[str]
    replay_id: str


def sign_in_and_sessions(admin: Browser) -> None:
    step("signing in: redirects without a session, a wrong token is refused, the admin's is not")
    for path in ("/", f"/consumers/{CONSUMER}", "/search", "/replays"):
        r = requests.get(CONSOLE_URL + path, allow_redirects=False, timeout=WAIT)
        check(r.status_code == 303 and urlparse(r.headers.get("location", "")).path == "/login",
              f"GET {path} without a session: expected 303 to /login, got {r.status_code} "
              f"location={r.headers.get('location')!r}")
    admin.get("/")
    admin.wait_path(r"/login", "the sign-in page, without a session")
    admin.one("input#token").send_keys("not-a-token")
    admin.one("button#sign-in").click()
    wait_for("admin: #login-error after a wrong token", lambda: admin.one("#login-error").is_displayed(), bool)
    r = requests.post(CONSOLE_URL + "/login", data={"token": "not-a-token"}, allow_redirects=False, timeout=WAIT)
    check(r.status_code == 401 and "login-error" in r.text,
          f"POST /login with a wrong token: expected 401 with #login-error, got {r.status_code}")

    admin.sign_in(ADMIN_TOKEN)
    cookies = admin.driver.get_cookies()
    session = [c for c in cookies if c.get("httpOnly")]
    check(session, f"admin: no HttpOnly cookie after signing in; cookies: {[c['name'] for c in cookies]}")
    for c in session:
        check(str(c.get("sameSite", "")).lower() == "strict",
              f"admin: the session cookie {c['name']} is SameSite={c.get('sameSite')}, expected Strict")
        visible = admin.driver.execute_script("return document.cookie")
        check(c["value"] not in visible, f"admin: the HttpOnly cookie {c['name']} is readable from document.cookie")
    forged = {c["name"]: "forged-session" for c in session}
    r = requests.get(CONSOLE_URL + "/", cookies=forged, allow_redirects=False, timeout=WAIT)
    check(r.status_code == 303, f"GET / with a made-up session cookie: expected 303 to /login, got {r.status_code}")

    step("the pages have an icon")
    icon = admin.one('link[rel="icon"]').get_attribute("href") or ""
    check(urlparse(icon).path == "/assets/favicon.svg", f"admin: link[rel=icon] points at {icon!r}")
    admin.driver.set_script_timeout(WAIT)
    answer = admin.driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch(arguments[0]).then(r => done([r.status, r.headers.get('content-type')])).catch(e => done(['' + e, '']));
    """, icon)
    check(answer == [200, "image/svg+xml"], f"admin: the icon {icon} answered {answer}")


def backlog_grows_and_shrinks(admin: Browser, g: Grpc, st: State) -> None:
    step(f"consumer {CONSUMER} on orders.* (max_deliveries 1), created over gRPC")
    c = g.admin.create_consumer(CONSUMER, ["orders.*"], max_deliveries=1, ack_deadline=30)
    check(c.name == CONSUMER, f"create_consumer answered {c}")
    admin.get("/")
    admin.chrome()
    wait_for(f"admin: a row for {CONSUMER} in table#consumers",
             lambda: len(admin.all(f'table#consumers tr[data-consumer="{CONSUMER}"]')), lambda n: n == 1,
             between=admin.driver.refresh, every=1.0)
    row = admin.one(f'table#consumers tr[data-consumer="{CONSUMER}"]')
    for cell in ("backlog", "in-flight", "dead", "oldest", "paused", "streams", "held"):
        admin.one(f"td.{cell}", row)
    link = admin.one("a.consumer-link", row).get_attribute("href") or ""
    check(urlparse(link).path == f"/consumers/{CONSUMER}", f"admin: a.consumer-link goes to {link!r}")
    admin.expect("td.paused", lambda t: t.lower() == "no", "no", row)
    # No minute sampled yet for a new consumer: dashes, not blank rate columns; no acks yet.
    for cell in ("td.acked-rate", "td.dead-rate"):
        admin.expect(cell, lambda t: t == "\u2014", "a dash (no rate yet)", row)
    admin.expect("td.acked", lambda t: first_int(t) == 0, "0", row)
    admin.one("section#relay .unrelayed")
    check(admin.all("section#alerts li.alert, section#alerts li.no-alert"),
          "admin: section#alerts has neither li.alert nor li.no-alert")

    step("20 messages enqueued with no stream attached: the backlog grows to 20 on its own")
    st.good = [g.enqueue(GOOD_TOPIC, "OrderCreated", {"order": i, "total": 100 + i}) for i in range(20)]
    wait_overview(admin, "backlog", 20, "20 enqueued, nothing consuming")
    wait_for("admin: section#relay .unrelayed to read 0", lambda: admin.text("section#relay .unrelayed"),
             lambda t: first_int(t) == 0)

    step("a subscriber acks 10 and stops: the backlog shrinks to 10")
    acked = asyncio.run(ack_some(10))
    check(len(acked) == 10, f"the subscriber acked {len(acked)} deliveries, expected 10")
    wait_overview(admin, "backlog", 10, "10 of 20 acked")
    wait_overview(admin, "acked", 10, "10 acked by this process's stream")
    s = g.stats()
    check(s.backlog == 10, f"over gRPC the backlog is {s.backlog}, expected 10 ({s})")

    step("the consumer's pending deliveries, listed from its page")
    admin.get(f"/consumers/{CONSUMER}")
    admin.one("a#list-pending").click()
    admin.wait_path(rf"/consumers/{CONSUMER}/deliveries", "the list of pending deliveries")
    admin.chrome()
    check(admin.one("table#deliveries").get_attribute("data-kind") == "pending", "admin: not the pending list")
    listed = {r.get_attribute("data-message-id") for r in admin.all("table#deliveries tr[data-message-id]")}
    check(listed == set(st.good) - set(acked),
          f"admin: the pending list holds {sorted(listed)}, expected the 10 not acked {sorted(set(st.good) - set(acked))}")
    admin.screenshot("deliveries.png")
    admin.one("a#list-in-flight").click()
    admin.wait_path(rf"/consumers/{CONSUMER}/deliveries", "the list of deliveries in flight")
    check(admin.one("table#deliveries").get_attribute("data-kind") == "in-flight", "admin: not the in-flight list")
    admin.one("#none")
    admin.get("/")


def messages_fail(admin: Browser, g: Grpc, st: State) -> None:
    step(f"5 messages of type {BROKEN_TYPE} nacked with `{ERROR}`: dead after their one delivery")
    st.broken = [g.enqueue(BROKEN_TOPIC, BROKEN_TYPE, {"order": 100 + i, "card": SECRET}) for i in range(5)]
    nacked, acked = asyncio.run(fail_broken(5))
    check(nacked == set(st.broken), f"nacked {sorted(nacked)}, expected the 5 Broken ones {sorted(st.broken)}")
    check(acked == 10, f"the failing subscriber acked {acked} good messages, expected the 10 left")
    s = g.stats()
    check(s.dead == 5 and s.backlog == 0, f"over gRPC: {s}, expected dead 5 and backlog 0")
    wait_overview(admin, "dead", 5, "5 nacked once with max_deliveries 1")
    wait_overview(admin, "backlog", 0, "everything else acked")
    wait_overview(admin, "acked", 20, "10 more acked by the failing subscriber")
    admin.screenshot("overview.png")

    step(f"the consumer page groups them: `{ERROR}`, count 5")
    admin.one(f'table#consumers tr[data-consumer="{CONSUMER}"] a.consumer-link').click()
    admin.wait_path(rf"/consumers/{CONSUMER}", "the consumer page from the overview's link")
    admin.chrome()
    for cell in ("backlog", "in-flight", "dead", "oldest", "paused"):
        admin.one(f"#stats .{cell}")
    check(first_int(admin.text("#stats .dead")) == 5, f"admin: #stats .dead reads {admin.text('#stats .dead')!r}")
    admin.one("table#held-keys")
    row = wait_dead_group(admin, 5)
    admin.expect("td.error .error-text", lambda t: t == ERROR, f"{ERROR!r} as it is", row)
    admin.expect("td.topics", lambda t: BROKEN_TOPIC in t, f"to name {BROKEN_TOPIC}", row)
    admin.expect("td.types", lambda t: BROKEN_TYPE in t, f"to name {BROKEN_TYPE}", row)
    for cell in ("td.first", "td.last"):
        check(admin.text(cell, row), f"admin: the dead group's {cell} is empty")
    check(admin.one("a.show-messages", row).get_attribute("href"), "admin: a.show-messages has no href")
    admin.one("form.dry-run button.dry-run-button", row)
    admin.screenshot("consumer.png")

    step("pause and resume with the page's buttons (admin:write)")
    admin.one("form#pause button#pause-button").click()
    wait_for(f"{CONSUMER} paused over gRPC after button#pause-button", g.paused, bool)
    # The figures may lag the action by the stats' caching (the form does not): a bounded wait.
    admin.get(f"/consumers/{CONSUMER}")
    wait_for("admin: #stats .paused to read yes once paused", lambda: admin.text("#stats .paused").lower(),
             lambda t: t == "yes", between=admin.driver.refresh, every=1.0)
    admin.one("form#resume button#resume-button").click()
    wait_for(f"{CONSUMER} running over gRPC after button#resume-button", lambda: not g.paused(), bool)
    admin.get(f"/consumers/{CONSUMER}")
    wait_for("admin: #stats .paused to read no once resumed", lambda: admin.text("#stats .paused").lower(),
             lambda t: t == "no", between=admin.driver.refresh, every=1.0)
    admin.one("form#pause button#pause-button")


def csrf_is_required(admin: Browser, g: Grpc) -> None:
    step("POSTs without the CSRF token are refused (403) and change nothing")
    admin.get(f"/consumers/{CONSUMER}")
    pause = f"/consumers/{CONSUMER}/pause"
    replay = f"/consumers/{CONSUMER}/replay"
    status = admin.fetch_post(pause, {})
    check(status == 403, f"admin: a same-origin fetch POST {pause} without csrf answered {status}, expected 403")
    for fields in ({}, {"csrf": "forged"}, {"csrf": ""}):
        r = admin.post(pause, fields)
        check(r.status_code == 403, f"admin's cookie, POST {pause} with {fields}: expected 403, got {r.status_code}")
    r = admin.post(replay, {"last_error": ERROR, "dry_run": "false", "max_per_second": "50"})
    check(r.status_code == 403, f"admin's cookie, POST {replay} without csrf: expected 403, got {r.status_code}")
    check(not g.paused(), f"{CONSUMER} is paused after POSTs without the CSRF token")
    s = g.stats()
    check(s.dead == 5 and s.backlog == 0,
          f"after a replay POST without the CSRF token: {s}, expected dead 5 and backlog 0")

    step("a form left open across a restart (its token no longer counts): a refusal page with a way back")
    admin.get(f"/consumers/{CONSUMER}")
    admin.driver.execute_script(
        "document.querySelector('form#pause input[name=csrf]').value = 'left-open-before-a-restart'")
    admin.one("form#pause button#pause-button").click()
    wait_for("admin: the refusal page (#refused)", lambda: admin.one("#refused").is_displayed(), bool)
    admin.expect("#refused h1", lambda t: "nothing was changed" in t.lower(), "to say nothing changed")
    admin.one('link[rel="stylesheet"][href="/assets/console.css"]')
    check(not g.paused(), f"{CONSUMER} is paused after a refused form")
    admin.one("a#back").click()
    admin.wait_path(rf"/consumers/{CONSUMER}", "the consumer page, from the refusal's way back")
    admin.one("form#pause button#pause-button")


def held_key_skip_is_confirmed(admin: Browser, g: Grpc) -> None:
    step(f"a held key ({KEYS_CONSUMER}, dead key policy hold): Skip it asks first, and says after what it did")
    g.admin.create_consumer(KEYS_CONSUMER, [KEYS_TOPIC], max_deliveries=1, ack_deadline=30, dead_key_policy="hold")
    first = g.enqueue(KEYS_TOPIC, "Reserved", {"sku": KEY, "n": 1}, ordering_key=KEY)
    second = g.enqueue(KEYS_TOPIC, "Reserved", {"sku": KEY, "n": 2}, ordering_key=KEY)
    asyncio.run(hold_key(first))
    admin.get(f"/consumers/{KEYS_CONSUMER}")
    row_css = f'table#held-keys tr.held-key[data-key="{KEY}"]'
    wait_for(f"admin: {row_css}", lambda: admin.one(row_css).is_displayed(), bool, between=admin.driver.refresh,
             every=1.0)
    row = admin.one(row_css)
    admin.expect("td.error .error-text", lambda t: t == KEYS_ERROR, f"{KEYS_ERROR!r} as it is", row)
    admin.one("form.release-skip button", row).click()
    admin.wait_path(rf"/consumers/{KEYS_CONSUMER}/keys/release", "the confirmation of Skip it")
    admin.chrome()
    admin.expect("#skip-confirm-text .waiting", lambda t: first_int(t) == 1, "1 message waiting behind it")
    held = [k.ordering_key for k in g.admin.list_held_keys(KEYS_CONSUMER).keys]
    check(held == [KEY], f"{KEYS_CONSUMER} holds {held} before Skip it is confirmed, expected [{KEY!r}]")
    admin.one("form#skip-confirm button#skip-button").click()
    admin.wait_path(rf"/consumers/{KEYS_CONSUMER}", "the consumer page after Skip it")
    admin.expect("#notice", lambda t: "Skipped" in t and KEY in t, f"to say the dead message of {KEY} was skipped")
    held = [k.ordering_key for k in g.admin.list_held_keys(KEYS_CONSUMER).keys]
    check(held == [], f"{KEYS_CONSUMER} still holds {held} after Skip it")
    got = asyncio.run(receive(KEYS_CONSUMER, {second}))
    check(set(got) == {second}, f"{KEYS_CONSUMER} delivered {sorted(got)}, expected the waiting {second}")


def deep_link_survives_sign_in(st: State) -> None:
    step("a deep link survives the sign-in: a fresh browser opening a message lands on it once signed in")
    fresh = Browser("deep-link")
    try:
        try:
            target = f"/messages/{st.broken[0]}"
            fresh.get(target)
            fresh.wait_path(r"/login", "the sign-in page for a deep link")
            nxt = parse_qs(urlparse(fresh.driver.current_url).query).get("next")
            check(nxt == [target], f"deep-link: the sign-in page leads to {nxt}, expected [{target!r}]")
            fresh.sign_in(ADMIN_TOKEN, landing=re.escape(target))
            fresh.one("table#meta")
            step("a sign-in never leads to another site, however its next page is spelt")
            console = urlparse(CONSOLE_URL).netloc
            for evil in ("//evil.example/", "/\\evil.example/", "https://evil.example/", "/\t/evil.example/"):
                fresh.get("/login?" + urlencode({"next": evil}))
                fresh.sign_in(ADMIN_TOKEN)
                here = urlparse(fresh.driver.current_url)
                check(here.netloc == console and here.path == "/",
                      f"deep-link: signing in with next={evil!r} led to {fresh.driver.current_url}")
        except Exception:
            fresh.keep_failure("deep-link")
            raise
    finally:
        fresh.quit()


def reader_sees_no_action(g: Grpc, st: State) -> None:
    step("a read-only principal (admin:read): no action, and its POSTs are refused")
    reader = Browser("reader")
    try:
        try:
            reader.sign_in(READER_TOKEN)
            reader.one(f'table#consumers tr[data-consumer="{CONSUMER}"]')
            reader.get(f"/consumers/{CONSUMER}")
            reader.chrome()
            wait_dead_group(reader, 5)
            for css in ("form#pause", "form#resume", "button#pause-button", "button#resume-button", "form.dry-run",
                        "button.dry-run-button"):
                reader.absent(css, "the reader has neither admin:write nor replay:")
            csrf = reader.csrf()
            pause = f"/consumers/{CONSUMER}/pause"
            # Without the token: refused for the token (403). With it: refused for the permission,
            # which the contract leaves at "refused" (a 4xx) rather than a status.
            r = reader.post(pause, {})
            check(r.status_code == 403,
                  f"reader's cookie, POST {pause} without csrf: expected 403, got {r.status_code}")
            status = reader.fetch_post(pause, {})
            check(status == 403,
                  f"reader: a same-origin fetch POST {pause} without csrf answered {status}, expected 403")
            r = reader.post(pause, {"csrf": csrf})
            check(400 <= r.status_code < 500,
                  f"reader's cookie, POST {pause} with its csrf but no admin:write: expected a refusal "
                  f"(4xx), got {r.status_code}")
            r = reader.post(f"/consumers/{CONSUMER}/replay",
                            {"csrf": csrf, "last_error": ERROR, "dry_run": "false", "max_per_second": "50"})
            check(400 <= r.status_code < 500,
                  f"reader's cookie, POST replay with its csrf but no replay: permission: expected a "
                  f"refusal (4xx), got {r.status_code}")
            check(not g.paused(), f"{CONSUMER} is paused after the reader's POSTs")
            s = g.stats()
            check(s.dead == 5, f"after the reader's replay POST: {s}, expected dead 5")
            reader.get(f"/messages/{st.broken[0]}")
            reader.absent("form.replay-message", "the reader has no replay: permission")
            reader.one("#payload-hidden")
            reader.absent("pre#payload", "the reader has no tail: permission")
            check(SECRET not in reader.driver.page_source, "reader: the payload's text is on the message page")
        except Exception:
            reader.keep_failure("reader")
            raise
    finally:
        reader.quit()


def notail_sees_no_payload(st: State) -> None:
    step("a principal with replay:* and no tail: sees the dry run and no payload")
    notail = Browser("notail")
    try:
        try:
            notail.sign_in(NOTAIL_TOKEN)
            notail.get(f"/consumers/{CONSUMER}")
            notail.chrome()
            row = wait_dead_group(notail, 5)
            notail.one("form.dry-run button.dry-run-button", row)
            notail.absent("form#pause", "notail has no admin:write")
            notail.absent("form#resume", "notail has no admin:write")
            notail.get(f"/messages/{st.broken[0]}")
            notail.chrome()
            notail.one("#payload-hidden")
            notail.absent("pre#payload", "notail has no tail: permission on orders.charged")
            check(SECRET not in notail.driver.page_source, "notail: the payload's text is on the message page")
            notail.one("table#headers")
            notail.one(f'table#timeline tr[data-consumer="{CONSUMER}"]')
        except Exception:
            notail.keep_failure("notail")
            raise
    finally:
        notail.quit()


def dry_run_and_replay(admin: Browser, g: Grpc, st: State) -> None:
    step("dry run of the group: 5 selected, nothing changed")
    admin.get(f"/consumers/{CONSUMER}")
    row = wait_dead_group(admin, 5)
    admin.one("form.dry-run button.dry-run-button", row).click()
    selected = wait_for("admin: #dry-run-result .selected to read 5", lambda: admin.text("#dry-run-result .selected"),
                        lambda t: first_int(t) == 5)
    check(first_int(selected) == 5, f"dry run selected {selected!r}")
    admin.expect("#dry-run-result .error-text", lambda t: t == ERROR, f"{ERROR!r} as it is")
    s = g.stats()
    check(s.dead == 5 and s.backlog == 0, f"after the dry run: {s}, expected dead 5 and backlog 0 (nothing changed)")
    admin.chrome()
    form = admin.one("form#replay-confirm")
    hidden = admin.one('input[name="csrf"]', form)
    check(hidden.get_attribute("type") == "hidden", "admin: the replay form's csrf field is not hidden")
    check(hidden.get_attribute("value") == admin.csrf(),
          "admin: the replay form's csrf field differs from the page's csrf-token meta tag")
    rate = admin.one('input[name="max_per_second"]', form)
    rate.clear()
    rate.send_keys("50")
    admin.screenshot("dry-run.png")

    step("replay at 50 per second: the progress page reaches done")
    admin.one("button#replay-button", form).click()
    m = admin.wait_path(r"/replays/([^/]+)", "the replay's progress page")
    st.replay_id = m.group(1)
    def progress_state() -> str:
        state = admin.text("#progress .state").lower()
        check(state not in ("failed", "stopped"), f"admin: the replay ended {state}: {admin.text('#progress')!r}")
        return state

    state = wait_for("admin: #progress .state to read done (the page refreshes itself)", progress_state,
                     lambda t: t == "done", timeout=WAIT * 2)
    check(state == "done", state)
    admin.expect("#progress .selected", lambda t: first_int(t) == 5, "5")
    admin.expect("#progress .replayed", lambda t: first_int(t) == 5, "5")
    admin.expect("#progress .error-text", lambda t: t == ERROR, f"{ERROR!r} as on every other screen")
    admin.chrome()
    admin.screenshot("replay.png")

    step("a subscriber receives the 5 again, from delivery 1, and acks them")
    got = asyncio.run(receive_replayed(set(st.broken)))
    check(set(got) == set(st.broken), f"received {sorted(got)}, expected only the 5 replayed {sorted(st.broken)}")
    for d in got.values():
        check(d.type == BROKEN_TYPE and d.topic == BROKEN_TOPIC, f"received {d.type} on {d.topic}: {d}")
        check(d.delivery_count == 1,
              f"message {d.message_id} came with delivery_count {d.delivery_count}, expected 1")
    wait_for("all 5 acked over gRPC", g.stats, lambda s: s.dead == 0 and s.backlog == 0 and s.in_flight == 0)
    admin.get("/")
    wait_overview(admin, "dead", 0, "the replayed messages acked")
    wait_overview(admin, "backlog", 0, "the replayed messages acked")


def message_page(admin: Browser, st: State) -> None:
    step("the message page: payload (admin has tail:), headers, timeline")
    message_id = st.broken[0]
    admin.get(f"/messages/{message_id}")
    admin.chrome()
    shown = admin.text("pre#payload")
    try:
        payload = json.loads(shown)
    except ValueError as e:
        raise Failed(f"admin: pre#payload is not the JSON payload: {shown[:200]!r}") from e
    check(payload == {"order": 100, "card": SECRET}, f"admin: pre#payload shows {payload}")
    check(shown.index('"order"') < shown.index('"card"'), f"admin: the payload's keys are not in their order: {shown!r}")
    admin.absent("#payload-hidden", "the admin may tail every topic")
    headers = admin.text("table#headers")
    check("content-type" in headers and "console-test" in headers, f"admin: table#headers reads {headers!r}")
    row = admin.one(f'table#timeline tr[data-consumer="{CONSUMER}"]')
    check(admin.text(".state", row) == "ACKED", f"admin: the timeline's state is {admin.text('.state', row)!r}")
    check(first_int(admin.text(".count", row)) == 1, f"admin: the timeline's count is {admin.text('.count', row)!r}")
    admin.one(".error", row)
    admin.one("form.replay-message button", row)
    admin.screenshot("message.png")

    step("one message replayed from its page: what it does first, then a message after")
    admin.one("form.replay-message button", row).click()
    admin.wait_path(rf"/messages/{message_id}/replay", "the replay's confirmation")
    admin.chrome()
    admin.expect("#replay-message-result .state", lambda t: t == "ACKED", "ACKED")
    admin.one("form#replay-message-confirm button#replay-message-button").click()
    admin.wait_path(rf"/messages/{message_id}", "the message page after its replay")
    admin.expect("#notice", lambda t: f"Replayed to {CONSUMER}" in t, f"to say it was replayed to {CONSUMER}")
    got = asyncio.run(receive(CONSUMER, {message_id}))
    check(got[message_id].delivery_count == 1, f"the replayed message came with count {got[message_id].delivery_count}")


def search(admin: Browser, st: State) -> None:
    step("search: by type with the form, by topic page after page, by id")
    admin.one("a#nav-search").click()
    admin.wait_path(r"/search", "the search page from the nav")
    admin.chrome()
    form = admin.one("form#search")
    field = admin.one('[name="type"]', form)
    field.clear()
    field.send_keys(BROKEN_TYPE)
    buttons = admin.all('button[type="submit"], input[type="submit"], button:not([type])', form)
    if buttons:
        buttons[0].click()
    else:
        form.submit()
    ids = wait_for(f"admin: the {BROKEN_TYPE} messages in table#results", lambda: sorted(result_ids(admin)),
                   lambda v: v == sorted(st.broken))
    check(ids == sorted(st.broken), str(ids))
    admin.screenshot("search.png")

    admin.get("/search?" + urlencode({"topic": GOOD_TOPIC}))
    seen: list[str] = []
    for _ in range(25):
        seen += result_ids(admin)
        nxt = admin.all("a#next")
        if not nxt:
            break
        admin.driver.get(nxt[0].get_attribute("href") or "")  # get() waits for the next page
    check(sorted(seen) == sorted(st.good),
          f"admin: topic {GOOD_TOPIC} page after page gave {len(seen)} ids ({len(set(seen))} distinct), "
          "expected the 20 enqueued")

    # By id: the one message, listed alone or shown at once.
    admin.get("/search?" + urlencode({"message_id": st.broken[1]}))
    check(admin.path() == f"/messages/{st.broken[1]}" or result_ids(admin) == [st.broken[1]],
          f"admin: search by message_id led to {admin.path()} listing {result_ids(admin)}")
    admin.get("/search?" + urlencode({"type": "NoSuchType"}))
    check(result_ids(admin) == [], f"admin: search for an unknown type gave {result_ids(admin)}")

    # By topic pattern: `*` one segment, `>` the rest.
    for pattern in ("orders.*", "orders.>", "*.charged"):
        admin.get("/search?" + urlencode({"topic": pattern}))
        want = set(st.broken) if pattern == "*.charged" else set(st.good) | set(st.broken)
        check(set(result_ids(admin)) == want,
              f"admin: search for topic {pattern} gave {len(result_ids(admin))} ids, expected {len(want)}")
    admin.get("/search?" + urlencode({"topic": "orders.*.x"}))
    check(result_ids(admin) == [], f"admin: orders.*.x matched {result_ids(admin)}")


def replays_list(admin: Browser, st: State) -> None:
    step("the replays list names who replayed what")
    admin.one("a#nav-replays").click()
    admin.wait_path(r"/replays", "the replays list from the nav")
    admin.chrome()
    rows = admin.all("table#replays tr[data-replay]")
    check(rows, "admin: table#replays has no tr[data-replay]")
    mine = [r for r in rows if r.get_attribute("data-replay") == st.replay_id]
    if not mine:  # the row's id need not be the progress page's; then the replay that did the work
        mine = [r for r in rows
                if admin.text(".consumer", r) == CONSUMER and first_int(admin.text(".replayed", r)) == 5]
    check(mine, f"admin: no row of table#replays for replay {st.replay_id} of {CONSUMER}")
    row = mine[0]
    admin.expect(".principal", lambda t: t == ADMIN_PRINCIPAL, ADMIN_PRINCIPAL, row)
    admin.expect(".consumer", lambda t: t == CONSUMER, CONSUMER, row)
    admin.expect(".selected", lambda t: first_int(t) == 5, "5", row)
    admin.expect(".replayed", lambda t: first_int(t) == 5, "5", row)
    admin.expect(".state", lambda t: t.lower() == "done", "done", row)
    admin.expect(".selection .error-text", lambda t: t == ERROR, f"{ERROR!r} as on every other screen", row)
    admin.screenshot("replays.png")


def sign_out(admin: Browser) -> None:
    step("signing out")
    form = admin.one("form#sign-out")
    buttons = admin.all('button, input[type="submit"]', form)
    if buttons:
        buttons[0].click()
    else:
        form.submit()
    admin.wait_path(r"/login", "the sign-in page after signing out")
    admin.get("/")
    admin.wait_path(r"/login", "the sign-in page for / after signing out")


def main() -> int:
    # Stopped from outside (the Rust test's timeout): leave through the `finally`s, which quit
    # the browsers, instead of leaving them behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"console {CONSOLE_URL}, gRPC {OUTBOXD_ADDR}, screenshots in {SCREENSHOT_DIR}", flush=True)
    g = Grpc()
    admin: Browser | None = None
    st = State()
    try:
        admin = Browser("admin")
        sign_in_and_sessions(admin)
        backlog_grows_and_shrinks(admin, g, st)
        messages_fail(admin, g, st)
        csrf_is_required(admin, g)
        held_key_skip_is_confirmed(admin, g)
        reader_sees_no_action(g, st)
        notail_sees_no_payload(st)
        deep_link_survives_sign_in(st)
        dry_run_and_replay(admin, g, st)
        message_page(admin, st)
        search(admin, st)
        replays_list(admin, st)
        sign_out(admin)
    except Failed as e:
        print(f"CONSOLE BROWSER TEST FAILED: {e}", flush=True)
        if admin is not None:
            admin.keep_failure("admin")
        return 1
    except Exception:  # noqa: BLE001 - anything else is a failure too, with its traceback
        traceback.print_exc()
        print("CONSOLE BROWSER TEST FAILED: an unexpected error (traceback above)", flush=True)
        if admin is not None:
            admin.keep_failure("admin")
        return 1
    finally:
        if admin is not None:
            admin.quit()
        g.close()
    print("CONSOLE BROWSER TEST OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
