"""Workloads as columnar arrays: synthetic generators and real traces."""
