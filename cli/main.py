"""Entry point of the ``agentscope`` command."""

from __future__ import annotations

import sys


def main() -> None:
    """Run the agentscope command line."""
    from . import __doc__ as doc

    print(doc)
    sys.exit(0)
