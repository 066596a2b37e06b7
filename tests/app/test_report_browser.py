"""The run report's tables as a browser lays them out (Debian's headless Chromium, as in
test_browser): they fit the page's width without sideways scrolling, a value and its interval
stay on one line, and no row grows to the 100 px the raw dataframe rows took."""

from __future__ import annotations

from tiny_report import run_report, tiny_report_scenario

from tests.app.test_browser import browser  # noqa: F401 - the Chromium fixture

SCENARIO = tiny_report_scenario("report_layout", ("multi_lora", "preft"), num_seeds=2)

LAYOUT = """
return Array.from(document.querySelectorAll('div.scroll')).map(box => {
  const table = box.querySelector('table');
  const rows = Array.from(table.querySelectorAll('tbody tr'));
  return {title: box.closest('details') ? 'folded' : (box.previousElementSibling || {}).textContent,
          scroll: box.scrollWidth - box.clientWidth,
          rows: rows.map(r => r.getBoundingClientRect().height),
          broken: Array.from(table.querySelectorAll('span.nw'))
                       .filter(s => s.getClientRects().length > 1).map(s => s.textContent),
          bands: table.querySelectorAll('span.nw').length};
});"""


def test_the_report_tables_fit_the_page_and_keep_each_interval_on_one_line(tmp_path,
                                                                            browser):  # noqa: F811
    result = run_report(tmp_path, "s.yaml", SCENARIO)  # asserts no point failed
    browser.get(result.report_path.resolve().as_uri())
    tables = browser.execute_script(LAYOUT)
    assert len(tables) >= 5  # cost profile, plan, simulation, analytical sections
    assert sum(t["bands"] for t in tables) >= 4  # the plan's and the summary's intervals
    one_line = min(h for t in tables for h in t["rows"])
    for table in tables:
        assert table["scroll"] <= 0, table  # no sideways scrolling at the report's width
        assert not table["broken"], table  # "0.123 (0.10-0.16)" never split over lines
        # A row wraps a few words at most: never the ~100 px rows of a raw dataframe.
        assert max(table["rows"]) <= 4.5 * one_line, table
