"""calibrate package."""
