"""The `molcap` program as users run it: the planner's commands, `molcap calibrate ...` and
`molcap verify`.

They are composed here, above both packages, so that neither `planner` nor `calibrate` imports
the other. `python -m app.cli` runs it from a checkout; the console script is `app.launch`.
"""

from __future__ import annotations

from planner.cli import interrupt  # first: it imports nothing heavy

if __name__ == "__main__":  # `python -m app.cli`: Ctrl-C while the imports below load
    interrupt.quit_on_ctrl_c()

from app.calibrate_commands import app as calibrate_app  # noqa: E402
from app.verify_command import verify  # noqa: E402
from planner.cli.commands import app  # noqa: E402

app.add_typer(calibrate_app, name="calibrate")
app.command()(verify)

if __name__ == "__main__":
    app()
