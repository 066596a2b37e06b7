"""Benchmarks of molcap: the scripts, their results as data (bench/results/) and the tables."""
