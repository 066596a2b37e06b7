"""The commands that produce a calibration, as a fitted profile records them (`commands:`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def current_command() -> str:
    """The `molcap calibrate ...` command this process runs, for a profile's record."""
    return "molcap calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:])


PROFILE_COMMAND_FILE = "profile-command.txt"
"""Under a samples root: the profile command that measured it, for the fitted profile's
`commands:` record (the fit cannot know the profile's flags otherwise)."""


def profile_command(out: Path, *, engine: str, device: str, gpu_kind: str, num_repeats: int,
                    quick: bool) -> str:
    """The `molcap calibrate profile` command with every flag spelled out: the one the CLI,
    the Slurm script and the Ray job run for these arguments."""
    return (f"molcap calibrate profile --engine {engine} --device {device} --gpu-kind "
            f"{gpu_kind} --repeats {num_repeats}{' --quick' if quick else ''} --out "
            + shlex.quote(str(out)))


def recorded_profile_command(root: Path) -> str:
    """The profile command recorded under a samples root (the last one run there)."""
    path = Path(root) / PROFILE_COMMAND_FILE
    if not path.exists():  # samples profiled before the command was recorded
        return f"molcap calibrate profile --out {root} (its other flags were not recorded)"
    return path.read_text().strip()
