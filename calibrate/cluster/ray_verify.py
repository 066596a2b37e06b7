"""Ray job: verify a capacity plan on a real vLLM engine on a GPU of the plan's kind.

    ray job submit --address http://HEAD:8265 --working-dir . -- \
        python calibrate/cluster/ray_verify.py scenarios/x.yaml --plan out/x/plan.json \
        --model-path /models/llama --out out/verify

One task, on a node with the plan's GPU kind (`accelerator_type:<kind>`) and as many GPUs as
its largest tensor-parallel replica, runs `calibrate.verify.run_verify` there; the result
comes back as a value and the driver writes OUT/verify.json and OUT/verify.html, prints the
table and exits 1 when a promised SLO was missed. The scenario, plan and adapters travel with
--working-dir; the model path must exist on the GPU nodes. A cluster without GPUs (or --device
cpu) runs the task on a CPU node (the path tested here on a local Ray instance).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CATALOGUE_TO_RAY = {"H100-SXM": "H100", "H200": "H200", "A100-80GB": "A100", "H20": "H20"}
"""sim.catalogue GPU kinds -> Ray's accelerator_type names."""


def task_resources(gpu_kind: str, num_gpus: int, device: str) -> dict:
    """Ray options of the verify task: GPUs and the accelerator type of the plan (none on
    CPU)."""
    if device == "cpu":
        return {}
    kind = CATALOGUE_TO_RAY.get(gpu_kind, gpu_kind)
    return dict(num_gpus=num_gpus, resources={f"accelerator_type:{kind}": 0.001})


def verify_task(scenario: str, plan: str | None, out: str, options: dict) -> dict:
    """Run verify in the worker; the files' text and the verdict."""
    from calibrate.verify import VerifyOptions, run_verify
    from calibrate.verify_report import terminal_text

    opts = VerifyOptions(**{k: Path(v) if k in ("model_path", "adapters_dir") and v else v
                            for k, v in options.items()})
    result = run_verify(Path(scenario), Path(plan) if plan else None, Path(out), opts)
    return dict(json=(Path(out) / "verify.json").read_text(),
                html=(Path(out) / "verify.html").read_text(), text=terminal_text(result),
                missed=result.missed_slos)


def main(argv: list[str] | None = None) -> int:
    """Submit the verify task; write its files; 0, or 1 when a promised SLO was missed."""
    import ray

    from calibrate.verify_plan import planned_deployments
    from planner.loading import load_scenario

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--plan", default=None)
    parser.add_argument("--out", default="out/verify")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--adapters", default=None)
    parser.add_argument("--strategy", action="append", default=[])
    parser.add_argument("--address", default=None, help="Ray address (default: auto/local)")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    plans = planned_deployments(scenario, Path(args.scenario),
                                Path(args.plan) if args.plan else None)
    gpu = plans[0].deployment.gpu
    num_gpus = max(p.deployment.tensor_parallel_size for p in plans)
    options = dict(device=args.device, num_requests=args.num_requests,
                   model_path=args.model_path, adapters_dir=args.adapters,
                   strategies=tuple(args.strategy))
    started = not ray.is_initialized()
    if started:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(verify_task).options(**task_resources(gpu, num_gpus, args.device))
        done = ray.get(remote.remote(str(Path(args.scenario).resolve()),
                                     str(Path(args.plan).resolve()) if args.plan else None,
                                     str(Path(args.out).resolve()), options))
    finally:
        if started:
            ray.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").write_text(done["json"])
    (out / "verify.html").write_text(done["html"])
    print(done["text"])
    for line in done["missed"]:
        print(f"SLO missed: {line}", file=sys.stderr)
    return 1 if done["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
