"""Open a report page in headless Chromium: its DOM after the scripts ran, or a screenshot.

Used by the report's tests, its scale benchmark and to make the README screenshot. Chromium
comes from the Debian package (``make browser``); nothing here reaches the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary ($CHROMIUM first), or None."""
    env = os.environ.get("CHROMIUM")
    if env and Path(env).exists():
        return env
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


@dataclass
class PageRun:
    dom: str
    seconds: float  # wall time of the whole browser process


def open_page(page: str | Path, *, fragment: str = "", screenshot: str | Path | None = None,
              window: tuple[int, int] = (1280, 1600), budget_ms: int | None = 5000,
              timeout: float = 120, binary: str | None = None) -> PageRun:
    """Load ``page`` (a local file) in headless Chromium; return the DOM after its scripts ran.

    ``fragment`` is appended to the URL (e.g. ``row=ID``). With ``screenshot`` a PNG is taken
    instead of dumping the DOM (Chromium does one or the other per run). ``budget_ms`` gives
    the page that much virtual time to settle (None: dump right after the load event).
    """
    binary = binary or find_chromium()
    if binary is None:
        raise FileNotFoundError("chromium not found: run `make browser` (apt-get install chromium)")
    url = Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else "")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}", "--hide-scrollbars",
               "--run-all-compositor-stages-before-draw"]  # whole frames in screenshots
        if budget_ms:
            cmd.append(f"--virtual-time-budget={budget_ms}")
        cmd += [f"--screenshot={Path(screenshot).resolve()}"] if screenshot else ["--dump-dom"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=timeout)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0 or (screenshot and not Path(screenshot).exists()):
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return PageRun(dom=proc.stdout, seconds=seconds)


def main(argv: list[str] | None = None) -> None:
    """``python -m infra.report_browser REPORT --row ID --screenshot OUT.png``: picture one row's timeline."""
    import argparse

    p = argparse.ArgumentParser(description="Screenshot a report page (optionally one row's timeline).")
    p.add_argument("page")
    p.add_argument("--row", help="row key: the page opens with this row's timeline")
    p.add_argument("--screenshot", required=True)
    p.add_argument("--window", default="1200x900", help="WIDTHxHEIGHT (default 1200x900)")
    args = p.parse_args(argv)
    w, h = (int(x) for x in args.window.lower().split("x"))
    open_page(args.page, fragment=f"row={args.row}" if args.row else "", screenshot=args.screenshot, window=(w, h))
    print(args.screenshot)


if __name__ == "__main__":
    main()
