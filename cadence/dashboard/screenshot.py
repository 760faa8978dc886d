"""A picture of the dashboard on a run, taken in headless chromium (for docs and reports).

    python -m cadence.dashboard.screenshot --runs runs --run NAME --out docs/images/dashboard.png

Needs playwright's Python package and Debian's chromium (`apt-get install chromium`); the
dashboard is served in a thread of this process on a free 127.0.0.1 port while the picture is taken.
"""

from __future__ import annotations

import argparse
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def screenshot(runs: Path, run: str, out: Path, tab: str = "charts", width: int = 1400, height: int = 900) -> Path:
    from playwright.sync_api import sync_playwright

    from cadence.dashboard.app import create_app
    from cadence.dashboard.serve import serving_in_thread

    with serving_in_thread(create_app(runs)) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"{url}/#/run/{run}")
        page.wait_for_selector("#chart-reward .main-svg", timeout=60_000)
        if tab != "charts":
            page.click(f'#tabs button[data-tab="{tab}"]')
        page.wait_for_timeout(1500)  # the last charts' transitions
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", default="dashboard.png")
    ap.add_argument("--tab", default="charts", choices=["charts", "pipeline", "samples", "config"])
    a = ap.parse_args()
    print(screenshot(Path(a.runs), a.run, Path(a.out), a.tab))


if __name__ == "__main__":
    main()
