"""engine_ext package."""
