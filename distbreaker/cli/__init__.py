"""The `distbreaker` command line: inspect and operate the fleet's shared state.

`main` is the console-script entry point; `cli` is the click group (for
CliRunner and for embedding). Each command's module is imported when the
command is first asked for (`app.COMMAND_MODULES`), so the CLI starts fast;
`cli.load_all()` imports them all.
"""

from __future__ import annotations

from .app import cli, main

__all__ = ["cli", "main"]
