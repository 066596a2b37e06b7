"""Calibration: which cost profile priced the numbers, and the predicted-vs-measured table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from app import layout, state
from planner.jobs.dashboard import pricing
from planner.outputs.people_columns import people_table

VALIDATION_FILES = (Path("docs/validation.md"), Path("docs/validation.json"))


def main() -> None:
    """The Calibration page."""
    scenario, problems, _ = layout.page("Calibration")
    scenario = layout.require(scenario, problems)
    st.title("Calibration")
    priced = pricing(scenario, state.scenarios_dir())
    if priced["derivation"]:
        st.info(f"Numbers priced by the profile `{priced['profile']}`, **not measured on "
                f"{priced['gpu']}**: {priced['derivation']}.")
    elif priced["profile"]:
        st.success(f"Numbers priced by the fitted cost profile `{priced['profile']}`: "
                   f"{priced['description']}.")
    else:
        st.warning(f"Numbers priced by **assumed defaults** for {priced['gpu']} (no fitted "
                   "profile for it; name one in `hardware.profile`): treat absolute times as "
                   "estimates and compare strategies relative to each other.")
    st.dataframe(priced["coefficients"], hide_index=True, key="coefficients")
    if not priced["fit_errors"].empty:
        with st.expander("the profile's fit errors (train and held-out steps)"):
            st.dataframe(people_table(priced["fit_errors"]), hide_index=True)
    st.subheader("Predicted vs measured")
    md, js = (Path(__file__).resolve().parents[2] / p for p in VALIDATION_FILES)
    if js.exists():
        data = json.loads(js.read_text(encoding="utf-8"))
        rows = data.get("rows", data) if isinstance(data, dict) else data
        # The markdown below is the table for people; the rows, unrounded, are a download.
        layout.raw_downloads("validation", pd.DataFrame(rows), "validation_raw")
    if md.exists():
        st.markdown(md.read_text(encoding="utf-8"))
    if not md.exists() and not js.exists():
        st.info("No validation table yet (docs/validation.md): the simulator's predictions "
                "have not been checked against measurements.")


main()
