"""Compare variants: the what-if scenario before and after one more knob change, side by side."""

from __future__ import annotations

import streamlit as st

from app import compute, knobs, layout, state
from planner.jobs.dashboard import COMPARED_METRICS, compare_summaries
from planner.outputs.interval_columns import variants_intervals
from planner.outputs.plan_figures import variants_figure
from planner.outputs.variant_tables import people_change_table
from planner.scenario.editing import field_value, set_field
from planner.scenario.loading import ScenarioError


def _variant_ui(scenario) -> tuple[str, object]:
    """The field to change for the "after" variant and its new value."""
    fields = {label: path for path, label in knobs.WORKLOAD_KNOBS[scenario.workload.kind]
              + knobs.HARDWARE_KNOBS}
    fields["GPU kind"] = "hardware.gpu"
    label = st.selectbox("change", list(fields), key="compare_field")
    path = fields[label]
    now = field_value(scenario, path)
    if path == "hardware.gpu":
        from planner.search.strategy_plan import gpu_specs

        gpus = sorted(gpu_specs(scenario))
        value = st.selectbox("to", gpus, index=gpus.index(now) if now in gpus else 0,
                             key="compare_value_gpu")
    elif isinstance(now, int):
        value = st.number_input("to", value=now * 2, step=1, key=f"compare_value:{path}")
    else:
        value = st.number_input("to", value=float(now or 1) * 2, format="%g",
                                key=f"compare_value:{path}")
    return path, value


def main() -> None:
    """The Compare variants page."""
    scenario, problems, whatif = layout.page("Compare variants")
    scenario = layout.require(scenario, problems)
    st.title("Compare two variants")
    st.caption("Before: the scenario as the sidebar sets it. After: the same with one more "
               "change. Both simulate the same cut of the workload and the same strategies.")
    if whatif is None:
        st.info("Pick at least one strategy in the sidebar.")
        return
    path, value = _variant_ui(scenario)
    try:
        after_full = state.validate(set_field(state.text(), path, value), state.source())
    except ScenarioError as err:
        for message in err.messages:
            st.error(message)
        return
    labels = [s.label for s in whatif.strategies]
    turns = st.session_state.get(knobs.KEY + "max_turns")
    after = knobs.whatif_scenario(after_full, labels, int(turns or 300))
    before_sim, after_sim = compute.simulate(whatif), compute.simulate(after)
    if before_sim.summary.empty or after_sim.summary.empty:
        st.error("A variant has no simulation results: "
                 + "; ".join(f"{k}: {v}" for k, v in {**before_sim.errors,
                                                      **after_sim.errors}.items()))
        return
    stacked, changes = compare_summaries(before_sim.summary, after_sim.summary)
    stacked = variants_intervals(stacked, {"before": whatif, "after": after})
    st.markdown(f"**{path}**: `{field_value(scenario, path)}` → `{value}`")
    metrics = [m for m in COMPARED_METRICS if m in stacked]
    for left_metric, right_metric in zip(metrics[::2], metrics[1::2], strict=False):
        left, right = st.columns(2)
        left.plotly_chart(variants_figure(stacked, left_metric, COMPARED_METRICS[left_metric]),
                          width="stretch", key=f"cmp_{left_metric}")
        right.plotly_chart(variants_figure(stacked, right_metric,
                                           COMPARED_METRICS[right_metric]),
                           width="stretch", key=f"cmp_{right_metric}")
    st.caption("Each value with its interval where the profile that priced it has a measured "
               "error ('seeds': the spread over seeds only; a value alone: no measured error).")
    st.dataframe(people_change_table(changes, stacked), hide_index=True, key="compare_changes")
    layout.raw_downloads("compare", changes, "compare_raw")


main()
