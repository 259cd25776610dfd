"""Execution profiles: what the first training step touched, in which order, and how to keep that on disk."""
