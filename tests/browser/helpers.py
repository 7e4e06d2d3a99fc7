"""What a browser test does with a page: visit it, log in through the admin's form, read a
computed style, take a screenshot; and the check every visit makes, that the page
logged no console error and no request of it failed (no 404 on a static file).

``Browser`` wraps the one Chromium of the run (the ``browser`` fixture); the
``signed_in`` fixture hands it over pointed at the module's live stack and logged in.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path

import requests

from tests.processes import ROOT

# Where README screenshots go: LLMGW_SCREENSHOTS=1 writes them here, a path elsewhere.
SCREENSHOT_DIR = ROOT / "docs" / "img"
# Every URL a page names for the browser to load (or to offer, as a preload or an icon).
_PAGE_REFS_JS = """
const urls = [];
for (const el of document.querySelectorAll('link[href]')) {
  if (['stylesheet', 'icon', 'shortcut icon', 'preload', 'modulepreload', 'manifest']
      .includes((el.getAttribute('rel') || '').toLowerCase())) urls.push(el.href);
}
for (const el of document.querySelectorAll('script[src], img[src]')) urls.push(el.src);
return urls;
"""
_STYLESHEETS_JS = """
const sheets = [];
for (const s of document.styleSheets) {
  let rules = 0;
  try { rules = s.cssRules.length; } catch (e) { rules = -1; }
  sheets.push([s.href, rules]);
}
return sheets;
"""


class PageProblems(AssertionError):
    pass


class Browser:
    """The run's Chromium, pointed at one live stack at a time."""

    def __init__(self, driver):
        self.driver = driver
        self.base_url = ""
        # URLs a page named that were fetched once and answered 200: checked once a run.
        self._refs_ok: set[str] = set()

    # ---- navigation --------------------------------------------------------------------

    def use(self, base_url: str) -> Browser:
        """Point at another stack; the previous one's cookies are dropped."""
        if self.base_url != base_url:
            self.forget_cookies()
            self.base_url = base_url.rstrip("/")
        return self

    def forget_cookies(self) -> None:
        """Every cookie, whatever page is open: a browser with no session anywhere.

        (WebDriver's own delete only reaches the open page's site, and cookies do not
        tell ports apart: each module's stack is on 127.0.0.1.)
        """
        self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})

    def leave(self) -> None:
        """A blank page, so no page of the stack keeps a connection open as its Daphne stops."""
        self.driver.get("about:blank")

    def url(self, path: str) -> str:
        return urllib.parse.urljoin(self.base_url + "/", path.lstrip("/"))

    @property
    def path(self) -> str:
        return urllib.parse.urlsplit(self.driver.current_url).path

    def visit(self, path: str):
        """Open ``path``, wait for it to load, and fail on any console error or failed request."""
        self.driver.get(self.url(path))
        self.wait_loaded()
        self.check_page()
        return self.driver

    def wait_loaded(self, timeout: float = 30) -> None:
        self.wait(
            lambda d: d.execute_script("return document.readyState") == "complete",
            "the page to load",
            timeout,
        )

    def wait(self, condition, what: str, timeout: float = 30):
        """Wait until ``condition(driver)`` is truthy; a deadline only bounds the wait."""
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(condition)
        except TimeoutException:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what} at {self.driver.current_url}"
            ) from None

    def find(self, css: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str = "body") -> str:
        return self.find(css).text

    # ---- the admin's login ---------------------------------------------------------------

    def log_in(self, username: str, password: str, next_path: str = "/admin/") -> None:
        """Log in through the admin's own login form, as an operator does."""
        self.forget_cookies()
        self.visit(f"/admin/login/?next={urllib.parse.quote(next_path)}")
        self.find("#id_username").send_keys(username)
        self.find("#id_password").send_keys(password)
        self.find("#login-form [type=submit]").click()
        self.wait(
            lambda d: self.path != "/admin/login/", f"the login of {username!r} to go through"
        )
        self.wait_loaded()
        self.check_page()
        assert self.path == next_path, f"logged in, but at {self.path}: {self.text()[:500]}"

    # ---- what the page looks like ----------------------------------------------------------

    def computed_style(self, css: str, *properties: str) -> dict[str, str]:
        return self.driver.execute_script(
            "const s = getComputedStyle(arguments[0]);"
            "return Object.fromEntries(arguments[1].map(p => [p, s[p]]));",
            self.find(css),
            list(properties),
        )

    def stylesheets(self) -> dict[str, int]:
        """Each stylesheet the page loaded, by URL, with its number of rules (-1: unreadable)."""
        return {href: rules for href, rules in self.driver.execute_script(_STYLESHEETS_JS) if href}

    def assert_styled(self) -> None:
        """The admin's CSS is in effect: base.css loaded with rules, the header painted."""
        sheets = self.stylesheets()
        base = [href for href in sheets if "/admin/css/base." in href]
        assert base and sheets[base[0]] > 0, f"admin/css/base.css not loaded: {sheets}"
        header = self.computed_style("#header", "backgroundColor", "display", "color")
        # Unstyled, the header is a transparent block of black text.
        assert header["backgroundColor"] not in ("rgba(0, 0, 0, 0)", "transparent"), header
        assert header["display"] == "flex", header

    def screenshot(self, name: str, whole_page: bool = False) -> Path | None:
        """A PNG of the window for the README, when LLMGW_SCREENSHOTS is set; else nothing.

        ``LLMGW_SCREENSHOTS=1`` writes ``docs/img/<name>.png``; a path writes there instead.
        ``whole_page``: the page down to its end, not only what the window shows.
        """
        where = os.environ.get("LLMGW_SCREENSHOTS", "")
        if where in ("", "0"):
            return None
        directory = SCREENSHOT_DIR if where == "1" else Path(where)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.png"
        if not whole_page:
            self.driver.save_screenshot(str(path))
            return path
        size = self.driver.get_window_size()
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        try:
            self.driver.set_window_size(size["width"], max(size["height"], height + 120))
            self.driver.save_screenshot(str(path))
        finally:
            self.driver.set_window_size(size["width"], size["height"])
        return path

    # ---- the check every page gets -----------------------------------------------------------

    def console_errors(self) -> list[str]:
        """SEVERE console entries since the last read: errors, uncaught exceptions, failed loads."""
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def failed_requests(self) -> list[str]:
        """Requests since the last read that answered 4xx/5xx or failed outright, from DevTools."""
        urls: dict[str, str] = {}
        failed = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            method, params = message.get("method"), message.get("params", {})
            if method == "Network.requestWillBeSent":
                urls[params["requestId"]] = params["request"]["url"]
            elif method == "Network.responseReceived":
                response = params["response"]
                if response["status"] >= 400:
                    failed.append(f"{response['status']} {response['url']}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                url = urls.get(params["requestId"], params["requestId"])
                failed.append(f"{params.get('errorText', 'failed')} {url}")
        return failed

    def broken_refs(self) -> list[str]:
        """Every stylesheet, script, icon and image the page names, fetched: those not 200."""
        cookies = {c["name"]: c["value"] for c in self.driver.get_cookies()}
        broken = []
        for url in self.driver.execute_script(_PAGE_REFS_JS):
            if url in self._refs_ok or not url.startswith(self.base_url):
                continue
            status = requests.get(url, cookies=cookies, timeout=30).status_code
            if status == 200:
                self._refs_ok.add(url)
            else:
                broken.append(f"{status} {url} (named by the page)")
        return broken

    def problems(self) -> list[str]:
        """Everything wrong since the last check; reading them clears the browser's logs."""
        found = [f"console: {m}" for m in self.console_errors()]
        found += [f"request: {r}" for r in self.failed_requests()]
        if self.driver.current_url.startswith(self.base_url):
            found += [f"reference: {r}" for r in self.broken_refs()]
        return found

    def check_page(self) -> None:
        problems = self.problems()
        if problems:
            raise PageProblems(
                f"{self.driver.current_url}: " + "\n  ".join(["problems:", *problems])
            )

    def forget_problems(self) -> None:
        """Drop what the logs hold so far (before a test starts: not its problems)."""
        self.driver.get_log("browser")
        self.driver.get_log("performance")

    def quit(self) -> None:
        self.driver.quit()
