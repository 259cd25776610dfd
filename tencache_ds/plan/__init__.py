"""Planning: from a profile and the machine's resources to slot counts, budgets and prefetch distances. Pure logic."""
