"""The planner's command line (Typer) and its Ctrl-C handling."""
