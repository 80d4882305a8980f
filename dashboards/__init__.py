"""Tooling for dashboards/: the picture of agentscope.json rendered from a VM run's real data.

Not part of the library (the wheel ships agentscope/ and cli/ only). See
docs/dashboards.md, "The picture".
"""
