"""The registry: the SQLite file of agents and events, the spool exec writes, claims."""
