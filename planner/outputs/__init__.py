"""Reports, figures and reading back saved output folders: they format values, never compute
them."""
