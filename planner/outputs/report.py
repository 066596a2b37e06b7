"""Self-contained HTML reports (plotly inlined, opens without network) and tidy table files.

Reports only format values they are given; nothing here computes a result.
"""

from __future__ import annotations

import html
import importlib.metadata
import platform
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from sim.io.files import write_atomic

_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1200px;color:#222}
h1{margin-bottom:.2rem} h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.5rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th{background:#f4f4f4} pre{background:#f7f7f7;padding:1rem;overflow:auto;font-size:.8rem}
.nw{white-space:nowrap}
.note{color:#555} .scroll{overflow-x:auto} summary{cursor:pointer;color:#135}
"""

_BANDED = re.compile(r"(-?[\d.,]+(?:e[-+]?\d+)? \((?:seeds )?[\d.,e+-]+-[\d.,e+-]+\))")
"""`0.123 (0.10-0.16)` as the people tables print a value and its interval."""

_VERSIONED = ("molcap", "numpy", "pandas", "pydantic", "simpy", "plotly", "pyarrow")


@dataclass
class ReportSection:
    """One titled part of a report: prose, figures and tables, in that order."""

    title: str
    text: str = ""
    figures: list[go.Figure | dict] = field(default_factory=list)
    tables: list[pd.DataFrame] = field(default_factory=list)


def package_versions() -> dict[str, str]:
    """Versions of Python and the packages that shaped the numbers."""
    versions = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _table_html(df: pd.DataFrame, max_rows: int = 200, max_open_rows: int = 15) -> str:
    """A scrollable table; long ones fold into a <details> so the charts stay in view."""
    shown = df.head(max_rows)
    body = shown.to_html(index=False, float_format=lambda x: f"{x:.4g}", border=0)
    # A value and its interval stay on one line; the table wraps between words instead.
    body = _BANDED.sub(r"<span class=nw>\1</span>", body)
    body = f"<div class=scroll>{body}</div>"
    if len(df) > max_rows:
        body += f"<p class=note>{len(df) - max_rows} more rows in the table files.</p>"
    if len(df) <= max_open_rows:
        return body
    return f"<details><summary>table ({len(df)} rows)</summary>{body}</details>"


def render_html(title: str, subtitle: str, sections: list[ReportSection],
                scenario_text: str) -> str:
    """The whole report as one HTML string with plotly.js inlined once."""
    parts = [f"<h1>{html.escape(title)}</h1><p class=note>{html.escape(subtitle)}</p>"]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.text:
            parts.append(f"<p>{html.escape(section.text)}</p>")
        # Figures may be plain dicts built valid (validating big ones costs seconds).
        parts += [pio.to_html(fig, full_html=False, include_plotlyjs=False, validate=False)
                  for fig in section.figures]
        parts += [_table_html(df) for df in section.tables]
    versions = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in package_versions().items())
    parts.append(f"<h2>Scenario</h2><pre>{html.escape(scenario_text)}</pre>")
    parts.append(f"<h2>Versions</h2><table>{versions}</table>")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script>{get_plotlyjs()}</script></head>"
            f"<body>{''.join(parts)}</body></html>")


def write_table(df: pd.DataFrame, stem: Path, parquet_rows: pd.DataFrame | None = None,
                ) -> list[Path]:
    """Write a tidy table as parquet and CSV next to each other; return both paths.
    `parquet_rows`: what the parquet file holds when it keeps more rows than the CSV (a cut
    turn table), written once instead of the CSV's rows first."""
    parquet, csv = stem.with_suffix(".parquet"), stem.with_suffix(".csv")
    write_atomic(parquet, (df if parquet_rows is None else parquet_rows).to_parquet(index=False))
    write_atomic(csv, df.to_csv(index=False).encode())
    return [parquet, csv]


def timestamp() -> str:
    """UTC time for report subtitles."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
