"""What the planner runs end to end: the main job, sweeps, resumable per-strategy points, the
dashboard's jobs."""
