"""Readings of the machine this process runs on: host memory and memory cgroups (host_memory.py), this process's
page-locking limits and ranks on the node (limits.py). A leaf layer: reads /proc, cgroup files, rlimits and the
environment, decides nothing, and imports nothing from tencache_ds, so plan/ and memory/ may both use it and plan/
itself stays free of machine reads."""
