"""A real headless browser for the dashboard tests: Debian's chromium and
chromium-driver, driven by selenium.

When chromium is missing it is installed with apt-get (as scripts/install.sh
does for the test extra) if this runs as root on a machine with apt; only if
neither chromium nor a way to install it is there is the test skipped, with
that reason. Selenium is part of the test extra (pyproject.toml).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver", "chromium-driver")
DRIVER_PATHS = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


def _find(names, extra=()) -> str | None:
    for n in names:
        if shutil.which(n):
            return shutil.which(n)
    return next((p for p in extra if os.path.exists(p)), None)


def ensure_chromium() -> tuple[str, str]:
    """(browser, driver) paths, installing them with apt-get when that is possible."""
    browser, driver = _find(BROWSERS), _find(DRIVERS, DRIVER_PATHS)
    if browser and driver:
        return browser, driver
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip("no chromium + chromium-driver here, and no way to install them (needs apt-get as root): "
                    "install them (Debian: apt-get install chromium chromium-driver) to run the browser test")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    res = subprocess.run([apt, "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"],
                         env=env, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:  # a stale package list: update once, then try again
        subprocess.run([apt, "update"], env=env, capture_output=True, timeout=600)
        res = subprocess.run([apt, "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"],
                             env=env, capture_output=True, text=True, timeout=900)
    browser, driver = _find(BROWSERS), _find(DRIVERS, DRIVER_PATHS)
    if not (browser and driver):
        pytest.fail(f"apt-get could not install chromium + chromium-driver:\n{res.stderr[-2000:]}")
    return browser, driver


def start_browser(tmp: Path):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: install the test extra (pip install -e '.[test]')")
    browser, driver = ensure_chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1800", f"--user-data-dir={tmp / 'chromium-profile'}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def artifacts_dir(tmp: Path) -> Path:
    """Screenshots go here: INFERQ_TEST_ARTIFACTS (CI uploads it), else the test's tmp dir."""
    out = Path(os.environ.get("INFERQ_TEST_ARTIFACTS") or tmp) / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    return out
