"""Ray job: measure every GPU kind of a cluster and write one fitted cost profile per kind.

    ray job submit --address http://HEAD:8265 --working-dir . -- \
        python calibrate/cluster/ray_calibrate.py --out out/calibrate

Each GPU kind Ray reports (`accelerator_type:<kind>` resources) gets one task on one of its
GPUs: `calibrate.jobs.measure` then `calibrate.jobs.fit`, run in the worker; the profile YAML
comes back as a value and the driver writes calibrate/profiles/<kind>-<engine>-<model>.yaml. A
cluster without GPUs (or --device cpu) profiles one CPU node as kind `cpu` (the path tested
here on a local Ray instance).
"""

from __future__ import annotations

import argparse
from pathlib import Path

RAY_TO_CATALOGUE = {"H100": "H100-SXM", "H200": "H200", "A100": "A100-80GB",
                    "A100-80G": "A100-80GB", "H20": "H20"}
"""Ray's accelerator_type names -> sim.hardware.catalogue GPU kinds."""


def gpu_kinds(resources: dict) -> list[str]:
    """Ray accelerator types present in the cluster's resources."""
    prefix = "accelerator_type:"
    return sorted(k[len(prefix):] for k in resources if k.startswith(prefix))


def main(argv: list[str] | None = None) -> list[Path]:
    """Submit one task per GPU kind; write the returned profiles; their paths."""
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/calibrate")
    parser.add_argument("--profiles", default="calibrate/profiles")
    parser.add_argument("--engine", default="vllm", choices=("vllm", "ced"))
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--address", default=None, help="Ray address (default: auto/local)")
    args = parser.parse_args(argv)
    started = not ray.is_initialized()
    if started:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    try:
        kinds = gpu_kinds(ray.cluster_resources()) if args.device != "cpu" else []
        from calibrate.jobs import calibrate_kind  # importable on every worker

        remote = ray.remote(calibrate_kind)
        refs = [remote.options(num_gpus=1, resources={f"accelerator_type:{k}": 0.001}).remote(
                    RAY_TO_CATALOGUE.get(k, k), "cuda", args.engine, args.out, args.repeats,
                    args.quick) for k in kinds]
        if not kinds:
            refs = [remote.remote("cpu", "cpu", args.engine, args.out, args.repeats, args.quick)]
        written = []
        for name, text in ray.get(refs):
            path = Path(args.profiles) / f"{name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
            print(f"wrote {path}")
        return written
    finally:
        if started:
            ray.shutdown()


if __name__ == "__main__":
    main()
