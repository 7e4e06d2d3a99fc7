"""A headless Chromium driven by Selenium, for tests/browser/: Debian's ``chromium`` and
``chromium-driver`` packages, never a browser or driver downloaded at run time.

The paths are explicit (``LLMGW_CHROMIUM`` / ``LLMGW_CHROMEDRIVER`` override
Debian's), the driver's ``Service`` is given its executable and the options their
binary, and ``SE_OFFLINE`` is set: Selenium Manager, which would otherwise look
for (and fetch) a driver, has nothing to do and may not go online if it tried.

``missing_browser()`` imports nothing, so tests/conftest.py can ask at collection
time on a machine without Selenium's browser, and say how to install it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

INSTALL_HINT = "apt-get install chromium chromium-driver"
# The window the pages are laid out in, and the README's screenshots are taken at.
WINDOW = (1366, 900)


def browser_paths() -> tuple[str | None, str | None]:
    """The Chromium and chromedriver executables to use, or None where there is none."""

    def find(env: str, default: str, name: str) -> str | None:
        path = os.environ.get(env) or default
        if Path(path).is_file() and os.access(path, os.X_OK):
            return path
        return shutil.which(name)

    return (
        find("LLMGW_CHROMIUM", "/usr/bin/chromium", "chromium"),
        find("LLMGW_CHROMEDRIVER", "/usr/bin/chromedriver", "chromedriver"),
    )


def missing_browser() -> str | None:
    """Why the browser tests cannot run here (what is missing), or None when they can."""
    chromium, driver = browser_paths()
    missing = [
        name for name, path in (("chromium", chromium), ("chromedriver", driver)) if not path
    ]
    if not missing:
        return None
    return f"no {' and no '.join(missing)} on this machine"


def start_chromium(log_path: Path):
    """A headless Chromium under the system chromedriver, logging the console and network.

    ``goog:loggingPrefs`` keeps the browser's console (``driver.get_log("browser")``)
    and the DevTools network events (``get_log("performance")``) the page checks
    read; chromedriver's own log goes to ``log_path``.
    """
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never go online
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_paths()
    if not chromium or not driver:
        raise RuntimeError(f"{missing_browser()}: {INSTALL_HINT}")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--metrics-recording-only",
        "--password-store=basic",
        "--hide-scrollbars",
        "--force-color-profile=srgb",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--lang=en-US",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    options.add_experimental_option(
        "perfLoggingPrefs", {"enableNetwork": True, "enablePage": False}
    )
    service = Service(executable_path=driver, log_output=str(log_path))
    return webdriver.Chrome(options=options, service=service)
