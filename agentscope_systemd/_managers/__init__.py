"""The managers agents run under: the ScopeManager seam, systemd, the cgroup and process modes."""
