"""The commands that produce a calibration, as a fitted profile records them (`commands:`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def current_command() -> str:
    """The `molcap calibrate ...` command this process runs, for a profile's record."""
    return "molcap calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:])


MEASURE_COMMAND_FILE = "measure-command.txt"
"""Under a samples root: the measure command that produced it, for the fitted profile's
`commands:` record (the fit cannot know the command's flags otherwise)."""
_OLD_COMMAND_FILE = "profile-command.txt"
"""What samples measured while the command was called `calibrate profile` record it in."""


def measure_command(out: Path, *, engine: str, device: str, gpu_kind: str, num_repeats: int,
                    quick: bool) -> str:
    """The `molcap calibrate measure` command with every flag spelled out: the one the CLI,
    the Slurm script and the Ray job run for these arguments."""
    return (f"molcap calibrate measure --engine {engine} --device {device} --gpu-kind "
            f"{gpu_kind} --repeats {num_repeats}{' --quick' if quick else ''} --out "
            + shlex.quote(str(out)))


def recorded_measure_command(root: Path) -> str:
    """The measure command recorded under a samples root (the last one run there)."""
    for name in (MEASURE_COMMAND_FILE, _OLD_COMMAND_FILE):
        path = Path(root) / name
        if path.exists():
            return path.read_text().strip()
    # samples measured before the command was recorded
    return f"molcap calibrate measure --out {root} (its other flags were not recorded)"
