"""docs/validation-gpu.md is what `calibrate.gpu_validate.render_markdown` makes of the committed
JSON, Splitwise section included (a hand edit or a render change shows here)."""

from __future__ import annotations

import json
from pathlib import Path

from calibrate.gpu_validate import render_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_committed_markdown_is_the_render_of_the_committed_json():
    result = json.loads((DOCS / "validation-gpu.json").read_text(encoding="utf-8"))
    text = render_markdown(result)
    assert text == (DOCS / "validation-gpu.md").read_text(encoding="utf-8")
    assert "## Whole steps on DGX-A100 and DGX-H100 (Splitwise, Llama-2-70B)" in text
    assert {r["hardware"] for r in result["splitwise"]["summary"]} == {
        "a100-80gb", "h100-80gb", "h100-80gb-pcap"}
