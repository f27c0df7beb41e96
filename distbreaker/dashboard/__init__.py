"""A live web dashboard of the fleet: `distbreaker dashboard` (extra ``distbreaker[dashboard]``).

Starlette + uvicorn; the pages are static HTML and JavaScript (no build step),
updated live over server-sent events fed by the transitions channel. Read-only
unless started with ``--allow-actions`` (then every action needs the bearer
token and is recorded with its actor and reason).
"""

from __future__ import annotations

from .app import Dashboard, create_app

__all__ = ["Dashboard", "create_app"]
