"""Ray job: verify a capacity plan on a real vLLM engine on a GPU of the plan's kind.

    ray job submit --address http://HEAD:8265 --working-dir . -- \
        python calibrate/cluster/ray_verify.py scenarios/x.yaml --plan out/x/plan.json \
        --gpu-kind H100-SXM --num-gpus 1 --model-path /models/llama --out out/verify

One task, on a node with that GPU kind (`accelerator_type:<kind>`) and as many GPUs as the
plan's tensor-parallel size, runs `molcap verify` there (the command, in a child process, as
a user runs it); the verify files come back as values, the driver writes them to OUT, prints
the table and exits with verify's status (1 when a promised SLO was missed). The scenario, plan
and adapters travel with --working-dir; the model path must exist on the GPU nodes. --device cpu
runs the task on any node (the path tested on a local Ray instance).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CATALOGUE_TO_RAY = {"H100-SXM": "H100", "H200": "H200", "A100-80GB": "A100", "H20": "H20"}
"""sim.hardware.catalogue GPU kinds -> Ray's accelerator_type names."""
FILES = ("verify.json", "verify.html")


def task_options(gpu_kind: str, num_gpus: int, device: str) -> dict:
    """Ray options of the verify task: the plan's GPUs and accelerator type (none on CPU)."""
    if device == "cpu":
        return {}
    kind = CATALOGUE_TO_RAY.get(gpu_kind, gpu_kind)
    return dict(num_gpus=num_gpus, resources={f"accelerator_type:{kind}": 0.001})


def verify_task(command: list[str], out: str) -> dict:
    """Run `molcap verify` in the worker: its exit status, output and files' text."""
    import subprocess

    done = subprocess.run(command, capture_output=True, text=True)
    files = {name: (Path(out) / name).read_text() for name in FILES
             if (Path(out) / name).exists()}
    return dict(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr,
                files=files)


def verify_command(args, molcap: list[str]) -> list[str]:
    """The `molcap verify` command line of these arguments."""
    command = [*molcap, "verify", str(Path(args.scenario).resolve()), "--device", args.device,
               "--num-requests", str(args.num_requests), "--out", str(Path(args.out).resolve())]
    for flag, value in (("--plan", args.plan), ("--model-path", args.model_path),
                        ("--adapters", args.adapters)):
        if value:
            command += [flag, str(Path(value).resolve()) if flag != "--model-path" else value]
    for label in args.strategy:
        command += ["--strategy", label]
    return command


def main(argv: list[str] | None = None) -> int:
    """Submit the verify task; write its files; verify's exit status."""
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--plan", default=None)
    parser.add_argument("--out", default="out/verify")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--gpu-kind", default="H100-SXM", help="The plan's catalogue GPU kind.")
    parser.add_argument("--num-gpus", type=int, default=1, help="The plan's TP size.")
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--adapters", default=None)
    parser.add_argument("--strategy", action="append", default=[])
    parser.add_argument("--molcap", default="molcap", help="The molcap command on the nodes.")
    parser.add_argument("--address", default=None, help="Ray address (default: auto/local)")
    args = parser.parse_args(argv)
    command = verify_command(args, args.molcap.split())
    started = not ray.is_initialized()
    if started:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    if verify_task.__module__ != "__main__":  # imported as a module the workers cannot import
        ray.cloudpickle.register_pickle_by_value(sys.modules[verify_task.__module__])
    try:
        remote = ray.remote(verify_task).options(
            **task_options(args.gpu_kind, args.num_gpus, args.device))
        done = ray.get(remote.remote(command, str(Path(args.out).resolve())))
    finally:
        if started:
            ray.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in done["files"].items():
        (out / name).write_text(text)
    sys.stdout.write(done["stdout"])
    sys.stderr.write(done["stderr"])
    return done["returncode"]


if __name__ == "__main__":
    sys.exit(main())
