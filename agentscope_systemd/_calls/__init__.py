"""Tool calls: each call of an agent in a cgroup of its own, its events, its shell."""
