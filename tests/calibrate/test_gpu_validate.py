"""docs/validation-gpu.md is what `calibrate.gpu_validate.render_markdown` makes of the committed
JSON, Splitwise section included (a hand edit or a render change shows here); the held-out runs
never include a run the profile was run-fitted on."""

from __future__ import annotations

import json
from pathlib import Path

from calibrate.gpu_fit import PROFILE_NAME, PROFILES_DIR
from calibrate.gpu_run_fit import FIT_OFFSET, FIT_STRIDE, fit_slice
from calibrate.gpu_runs import load_serving_runs
from calibrate.gpu_samples import DATA_DIR, RUNS_SUMMARY
from calibrate.gpu_validate import held_out_runs, render_markdown
from sim.cost.profile import RunFitRecord, load_profile

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_committed_markdown_is_the_render_of_the_committed_json():
    result = json.loads((DOCS / "validation-gpu.json").read_text(encoding="utf-8"))
    text = render_markdown(result)
    assert text == (DOCS / "validation-gpu.md").read_text(encoding="utf-8")
    assert "## Whole steps on DGX-A100 and DGX-H100 (Splitwise, Llama-2-70B)" in text
    assert {r["hardware"] for r in result["splitwise"]["summary"]} == {
        "a100-80gb", "h100-80gb", "h100-80gb-pcap"}


def _with_run_fit(profile, run_ids):
    record = RunFitRecord(
        dataset="agullo-dt@bae36e2d", group="ml_modelling/test_dataset", rule="a test",
        run_ids=tuple(run_ids), engine_version="vllm 0.8.5", commit="abc", targets="TPOT p50",
        window_s=90.0, warmup_s=30.0, start={}, fitted={}, rms_log_error_start=0.0,
        rms_log_error=0.0, num_simulations=0, wall_s=0.0)
    return profile.model_copy(update=dict(fit=profile.fit.model_copy(update=dict(
        run_fit=record))))


def test_the_validation_leaves_out_every_run_the_profile_was_fitted_on():
    runs = load_serving_runs(DATA_DIR / RUNS_SUMMARY)
    profile = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml")
    # A profile fitted on two of the every-4th runs and one other.
    fitted = {runs[0].run_id, runs[8].run_id, runs[2].run_id}
    held = held_out_runs(runs, 4, _with_run_fit(profile, fitted))
    assert not fitted & {r.run_id for r in held}
    assert len(held) == len(runs[::4]) - 2


def test_the_shipped_fit_and_the_committed_table_share_no_run():
    runs = load_serving_runs(DATA_DIR / RUNS_SUMMARY)
    result = json.loads((DOCS / "validation-gpu.json").read_text(encoding="utf-8"))
    scored = {row["run_id"] for row in result["runs"]["rows"]}
    # The rule of the fit's slice misses the validation's every-4th runs by construction...
    assert not {r.run_id for r in fit_slice(runs, FIT_OFFSET, FIT_STRIDE)} & {
        r.run_id for r in runs[::result["runs"]["every"]]}
    # ...and whatever the shipped profile records as fitted is not in the committed table.
    record = load_profile(PROFILES_DIR / f"{PROFILE_NAME}.yaml").fit.run_fit
    if record is not None:
        assert not set(record.run_ids) & scored
        assert result["runs"]["run_fit"]["run_ids"] == list(record.run_ids)
