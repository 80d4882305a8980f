"""The ``agentscope`` command line, built on the library's public API."""
