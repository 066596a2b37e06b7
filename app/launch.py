"""The `molcap` console script. Ctrl-C is handled before the CLI's imports load (seconds on a
busy machine), where it would otherwise end in a traceback."""

from __future__ import annotations

from planner.cli import interrupt


def main() -> None:
    interrupt.quit_on_ctrl_c()
    from app.cli import app

    app()
