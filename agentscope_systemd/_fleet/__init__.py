"""The fleet: AsyncFleet and its parts, agents, the blocking facade, the reaper, tmux."""
