"""`molcap verify`, planner side: what the engine runs for a planned deployment, the
simulator's prediction of it, and the checks of the measurements against it."""
