"""Validation benchmark: the fitted simulator vs the real engine (the table of docs/validation.md).

    python bench/bench_calibration.py [--profile cpu-vllm-tiny-llama] [--repeats 3] [--requests 48]
                                      [--out out/bench/calibration] [--docs]

Runs `molcap calibrate validate` (calibrate.jobs.validate): 22 vLLM workloads on the engine
(3 interleaved runs each, engine-thread CPU clock) and in the simulator under the profile, plus
the CED switch by context; writes validation.md and validation.json side by side in --out
(resumable: finished runs are kept), and with --docs copies both to docs/.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibrate import jobs  # noqa: E402
from sim.cost.profile import load_profile, profile_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu-vllm-tiny-llama")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--clock", default="cpu", choices=("cpu", "wall"))
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "calibration")
    parser.add_argument("--docs", action="store_true", help="Copy the table into docs/.")
    args = parser.parse_args()
    profile = load_profile(profile_path(args.profile))
    md = jobs.validate(profile, args.out, num_repeats=args.repeats, num_requests=args.requests,
                       clock=args.clock, command="python " + " ".join(sys.argv))
    print(md.read_text())
    if args.docs:
        for name in ("validation.md", "validation.json"):
            shutil.copy(args.out / name, ROOT / "docs" / name)
    print(f"wrote {md} and {md.with_suffix('.json')}")


if __name__ == "__main__":
    main()
