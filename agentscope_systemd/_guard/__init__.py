"""The guard: the decisions (policy), the loop, its process, the kill."""
