"""The run report's tables as a browser lays them out (Debian's headless Chromium, as in
test_browser): they fit the page's width without sideways scrolling, a value and its interval
stay on one line, and no row grows to the 100 px the raw dataframe rows took."""

from __future__ import annotations

from planner.jobs.run import run_scenario_file
from tests.app.test_browser import browser  # noqa: F401 - the Chromium fixture

SCENARIO = """\
name: report_layout
model: llama-3.1-8b
hardware: {gpu: H100-64GB}
engine: {max_num_seqs: 16, max_loras: 2}
strategies:
  - kind: multi_lora
    adapters: [{name: a, rank: 8}, {name: b, rank: 8}]
  - kind: preft
    adapters: [{name: a, rank: 8}, {name: b, rank: 8}]
workload: {kind: conversations, num_conversations: 6, num_turns: 2,
  num_initial_context_tokens: 256, num_user_tokens: 32, num_reply_tokens: 32,
  think_time_s: 1.0, arrival_rate_per_s: 2.0}
slo: {ttft_p99_s: 10}
search: {gpus: [H100-64GB], tensor_parallel_sizes: [1], num_seeds: 2,
  max_turns_per_evaluation: 12, max_num_replicas: 2}
"""

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
    (tmp_path / "s.yaml").write_text(SCENARIO, encoding="utf-8")
    result = run_scenario_file(tmp_path / "s.yaml", tmp_path / "out", backend="inline")
    assert not result.errors
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
