"""Files every package reads and writes the same way: located YAML input, atomic writes, resumable
point stores."""
