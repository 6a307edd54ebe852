"""Print a demo run's headline table (Markdown) and screenshot one report figure for the README.

Usage::

    python3 scripts/readme_assets.py runs/demo [--figure-section behaviour] \\
        [--png docs/img/demo_behaviour.png]

The table comes from :func:`goalprobe.report.headline_rows` (and, for a run with the positive
control in ``RUN/control/``, both agents side by side, :mod:`goalprobe.report.agents`); the
figure is the first plotly figure of the chosen report section, rendered by headless Chromium
(playwright), offline.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from goalprobe.report import headline_rows
from goalprobe.report.agents import side_by_side_markdown
from goalprobe.report.run import RunReader


def headline_markdown(run_dir: Path) -> str:
    """The headline rows of ``run_dir`` as a Markdown table."""
    lines = [
        "| finding | value (95% CI) | baseline | interval excludes the baseline? |",
        "|---|---|---|---|",
    ]
    for row in headline_rows(run_dir):
        lines.append(f"| {row.finding} | {row.value} | {row.baseline} | {row.verdict} |")
    return "\n".join(lines)


def screenshot(report: Path, section: str, png: Path) -> None:
    """Save the first plotly figure of ``section`` in ``report`` as ``png``."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium binary on PATH (Debian package 'chromium')")
    png.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.route("http*://**", lambda route: route.abort())  # offline, like the report
        page.goto(report.resolve().as_uri())
        figure = page.locator(f"section#{section} .plotly-graph-div").first
        figure.wait_for(state="visible", timeout=30_000)
        figure.screenshot(path=str(png))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--figure-section", default="behaviour")
    parser.add_argument("--png", type=Path, default=Path("docs/img/demo_behaviour.png"))
    args = parser.parse_args()
    print(headline_markdown(args.run_dir))
    if RunReader(args.run_dir).layout.control.stages_dir.is_dir():
        print()
        print(side_by_side_markdown(args.run_dir))
    screenshot(args.run_dir / "report.html", args.figure_section, args.png)
    print(f"figure: {args.png}")


if __name__ == "__main__":
    main()
