"""Compare the headline table of a demo run with another run's, or with a saved copy.

Issue 20's rule: a change of code must leave the demo's headline table identical on the same
seed. The table is read from the run's report (``RunLayout.report``), so runs written by two
versions of the code compare, whatever markup each version's report uses::

    python3 scripts/compare_headline.py RUN_A RUN_B          # two runs
    python3 scripts/compare_headline.py RUN --save head.json  # keep a run's table
    python3 scripts/compare_headline.py RUN --against head.json

Exit status: 0 when the tables are identical (or after ``--save``), 1 when they differ (every
difference is printed), 2 when a report has no headline table.
"""

from __future__ import annotations

import argparse
import json
import sys
from html.parser import HTMLParser
from pathlib import Path

from goalprobe.run_layout import RunLayout

Row = tuple[str, ...]


class _HeadlineParser(HTMLParser):
    """Collects the body rows of the table inside the element with ``id="headline"``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[Row] = []
        self._depth = 0  # open elements inside the headline section (0: outside it)
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._depth == 0:
            if dict(attrs).get("id") == "headline":
                self._depth = 1
            return
        self._depth += 1
        if tag == "tr":
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if tag == "td" and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row:
            self.rows.append(tuple(self._row))
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def headline_of_report(html: str) -> list[Row]:
    """``(finding, value, baseline)`` rows of a report page's headline table (text, unescaped).

    Raises:
        ValueError: the page has no headline table.
    """
    parser = _HeadlineParser()
    parser.feed(html)
    parser.close()
    if not parser.rows:
        raise ValueError("no headline table (section id 'headline') in the report")
    return parser.rows


def headline_of_run(run_dir: Path) -> list[Row]:
    """The headline rows of the report of the run directory ``run_dir``."""
    report = RunLayout(run_dir).report
    try:
        return headline_of_report(report.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{report}: {err}") from err


def differences(a: list[Row], b: list[Row], names: tuple[str, str] = ("A", "B")) -> list[str]:
    """Every difference between two headline tables, matched by finding; empty if identical."""
    out = []
    by_a = {r[0]: r for r in a}
    by_b = {r[0]: r for r in b}
    for finding in dict.fromkeys([*by_a, *by_b]):
        ra, rb = by_a.get(finding), by_b.get(finding)
        if ra is None or rb is None:
            where = names[1] if ra is None else names[0]
            out.append(f"{finding}: only in {where}")
        elif ra != rb:
            out.append(f"{finding}:\n  {names[0]}: {ra[1:]}\n  {names[1]}: {rb[1:]}")
    if not out and [r[0] for r in a] != [r[0] for r in b]:
        out.append("the same rows in a different order")
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory holding report.html")
    parser.add_argument("other", type=Path, nargs="?", help="a second run directory")
    # dest "save_to", not "save": nnsight (imported by a run in the same process) adds a
    # ``save`` method to every object, which argparse then takes for an option already set
    parser.add_argument(
        "--save", dest="save_to", type=Path, help="write the run's headline table (JSON)"
    )
    parser.add_argument("--against", type=Path, help="compare with a table saved by --save")
    args = parser.parse_args(argv)
    if sum(x is not None for x in (args.other, args.save_to, args.against)) != 1:
        parser.error("give exactly one of OTHER, --save FILE and --against FILE")
    try:
        rows = headline_of_run(args.run)
        if args.save_to is not None:
            args.save_to.write_text(json.dumps([list(r) for r in rows], indent=1) + "\n")
            print(f"saved {len(rows)} headline rows of {args.run} to {args.save_to}")
            return 0
        if args.other is not None:
            other, name = headline_of_run(args.other), str(args.other)
        else:
            other = [tuple(r) for r in json.loads(args.against.read_text(encoding="utf-8"))]
            name = str(args.against)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    found = differences(rows, other, (str(args.run), name))
    if found:
        print("\n".join(found))
        print(f"{len(found)} difference(s) in the headline table")
        return 1
    print(f"headline tables identical ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
