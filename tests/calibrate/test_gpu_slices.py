"""The GPU slices in data/gpu are what data/cut_gpu_slices.py (and, for agullo-dt, also
data/gpu/cut_agullo_slice.py) cuts from the full datasets (byte for byte). The agullo-dt adapter
load logs (`server_out.loads.log`) are cut by data/gpu/cut_agullo_loads.py from the upstream
repository, which the shared data does not hold: they are left out of the comparison. Needs
the full data: skipped unless MOLCAP_DATA_DIR points at a copy of the team's shared data
(holding gpu/<dataset> and perf/)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from calibrate.gpu_data.export import REPO_DATA

FULL = Path(os.environ.get("MOLCAP_DATA_DIR", "")) if os.environ.get("MOLCAP_DATA_DIR") else None
CUTS = {  # slice folder -> (cut function, full dataset folder under the data root)
    "agullo-dt": ("cut_agullo", "gpu/agullo-dt"),
    "vidur": ("cut_vidur", "gpu/vidur"),
    "llmservingsim-profiles": ("cut_llmservingsim", "gpu/llmservingsim-profiles"),
    "splitwise": ("cut_splitwise", "perf"),
    "memory-gap": ("cut_memory_gap", "gpu/memory-gap"),
}


UPSTREAM_ONLY = {"server_out.loads.log", "engine_metrics.csv", "sharegpt_first_turns.csv"}
"""Files cut from upstream sources, not from the shared data (data/gpu/cut_agullo_loads.py,
cut_agullo_engine_metrics.py, cut_sharegpt_first_turns.py)."""


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in UPSTREAM_ONLY}


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(FULL is None or not (FULL / "gpu").is_dir(),
                    reason="set MOLCAP_DATA_DIR to a copy of the full data (gpu/, perf/)")
@pytest.mark.parametrize("name", sorted(CUTS))
def test_the_shipped_slice_is_what_the_cut_script_writes(tmp_path, name):
    function, source = CUTS[name]
    getattr(_load_script(REPO_DATA / "cut_gpu_slices.py"), function)(FULL / source,
                                                                      tmp_path / name)
    if name == "agullo-dt":
        _load_script(REPO_DATA / "gpu" / "cut_agullo_slice.py").main(FULL / "gpu",
                                                                     tmp_path / name)
    assert _files(tmp_path / name) == _files(REPO_DATA / "gpu" / name)
