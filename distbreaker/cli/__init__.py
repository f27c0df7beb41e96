"""The `distbreaker` command line: inspect and operate the fleet's shared state.

`main` is the console-script entry point; `cli` is the click group (for
CliRunner and for embedding). Importing the submodules registers the commands.
"""

from __future__ import annotations

from . import (  # noqa: F401  (register the commands)
    actions,
    dashboard_cmd,
    demo_cmd,
    doctor,
    ganesha_cmd,
    views,
    watch,
)
from .app import cli, main

__all__ = ["cli", "main"]
