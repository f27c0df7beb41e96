"""The dashboard's ASGI app (Starlette): static pages, a JSON API and one server-sent
event stream.

- ``GET /``: the fleet page; ``GET /breakers/{name}``: one breaker's page.
- ``GET /api/config``: whether operator actions are enabled.
- ``GET /api/events``: server-sent events: ``status`` (Redis reachable or not),
  ``snapshot`` (the fleet's rows, with each name's recent rates, on connect and
  whenever a stream fell behind), ``update`` (only the rows that changed and the keys
  of those gone, numbered by ``seq``; nothing while nothing changes),
  ``transition`` (one transition from the channel, as it happens). Filtered by
  ``?name=NAME`` (repeatable: only these names' rows and transitions) and
  ``?type=KIND`` (repeatable: only these kinds), e.g.
  ``/api/events?name=payments&type=transition`` streams one breaker's transitions.
- ``GET /api/breakers/{name}``: everything stored about one name (the CLI's
  ``show --json``) plus its last 200 transitions.
- ``POST /api/breakers/{name}/actions/{action}``: an operator action (only with
  ``allow_actions``, and ``Authorization: Bearer <token>``); the JSON body's
  ``reason`` and ``actor`` are recorded in the history like the CLI's.

Everything read goes through `distbreaker.readside`, everything written through
`distbreaker.operate` (one breaker script call per action).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import operate
from .. import readside as view
from .._runtime.keys import validate_name
from ..errors import SchemaError
from .hub import Filter, Hub

STATIC = Path(__file__).parent / "static"
HISTORY = 200
KEEPALIVE_S = 15.0
MAX_TEXT = 500  # characters of a reason or actor
EVENT_KINDS = ("status", "snapshot", "update", "transition")


def unavailable(exc: BaseException) -> Response:
    """Redis failed or refused: 503 with one line, never a traceback page."""
    return JSONResponse({"error": f"Redis error: {exc}"[:500]}, status_code=503)


def sse(kind: str, data: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class Dashboard:
    """The app's state: the hub, a client for requests, and the action settings."""

    def __init__(self, connect: Callable[[], Any], prefix: str, *, refresh: float = 2.0,
                 allow_actions: bool = False, token: str | None = None) -> None:
        if allow_actions and not token:
            raise ValueError("operator actions need a bearer token")
        self.connect = connect
        self.prefix = prefix
        self.allow_actions = allow_actions
        self.token = token
        self.hub = Hub(connect, prefix, refresh)
        self._client: Any = None
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The client API requests use (thread-safe, opened on first use)."""
        with self._client_lock:
            if self._client is None:
                self._client = self.connect()
            return self._client

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- pages and API ---------------------------------------------------------------------
    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def breaker_page(self, request: Request) -> Response:
        return FileResponse(STATIC / "breaker.html")

    async def config(self, request: Request) -> Response:
        return JSONResponse({"prefix": self.prefix, "actions": self.allow_actions,
                             "action_ids": {a.id: a.command for a in operate.ACTIONS.values()}})

    async def events(self, request: Request) -> Response:
        names = request.query_params.getlist("name")
        kinds = request.query_params.getlist("type")
        try:
            for name in names:
                validate_name(name)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        unknown = sorted(set(kinds) - set(EVENT_KINDS))
        if unknown:
            return JSONResponse({"error": f"unknown event type {unknown[0]!r}; one of "
                                 + ", ".join(EVENT_KINDS)}, status_code=422)
        wanted = Filter(frozenset(names), frozenset(kinds))
        queue = self.hub.subscribe(wanted)

        async def stream() -> AsyncIterator[str]:
            try:
                for kind, data in self.hub.first_messages(wanted):
                    yield sse(kind, data)
                while True:
                    try:
                        kind, data = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                    except asyncio.TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if kind == "resync":  # it missed diffs: the whole fleet again
                        for kind, data in self.hub.first_messages(wanted):
                            yield sse(kind, data)
                        continue
                    yield sse(kind, data)
            finally:
                self.hub.unsubscribe(queue)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})

    def detail(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            validate_name(name)
            schema = request.query_params.get("schema") or None
            found = view.read_detail_any(self.client, self.prefix, name, schema)
            if not found["exists"]:
                suggestions = operate.close_names(
                    name, list(view.scan_names(self.client, self.prefix)))
                return JSONResponse({"error": f"unknown name {name!r}",
                                     "suggestions": suggestions}, status_code=404)
            try:
                found["history"] = view.read_history(self.client, self.prefix, name, HISTORY,
                                                     found["schema"])
            except SchemaError:  # the stream key holds another type: found["error"] says so
                found["history"] = []
            breaker = found.get("breaker") or {}
            if breaker.get("shadowed"):  # shadow configs (docs/guides/shadow.md)
                try:
                    found["shadows"] = view.read_shadows(self.client, self.prefix, name)
                except SchemaError:
                    found["shadows"] = []
        except (SchemaError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        except redis.RedisError as exc:
            return unavailable(exc)
        return JSONResponse(found)

    async def action(self, request: Request) -> Response:
        if not self.allow_actions:
            return JSONResponse({"error": "read-only dashboard: start it with "
                                 "--allow-actions to enable operator actions"},
                                status_code=403)
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), (self.token or "").encode()):
            return JSONResponse({"error": "a valid bearer token is needed"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        action = operate.ACTIONS.get(request.path_params["action"])
        if action is None:
            return JSONResponse({"error": "unknown action; one of "
                                 + ", ".join(operate.ACTIONS)}, status_code=404)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, status_code=400)
        body = body if isinstance(body, dict) else {}
        host = request.client.host if request.client else "unknown"
        actor = str(body.get("actor") or "").strip()[:MAX_TEXT]
        actor = f"{actor} via dashboard" if actor else f"dashboard@{host}"
        reason = (str(body.get("reason") or "").strip()[:MAX_TEXT]
                  or f"{action.command} from the distbreaker dashboard")
        return await run_in_threadpool(self._act, request.path_params["name"], action,
                                       reason, actor, bool(body.get("create")))

    def _act(self, name: str, action: operate.Action, reason: str, actor: str,
             create: bool) -> Response:
        try:
            validate_name(name)
            result = operate.act(self.client, self.prefix, name, action, reason, actor,
                                 create=create)
        except operate.UnknownBreaker as exc:
            return JSONResponse({"error": str(exc), "suggestions": exc.suggestions},
                                status_code=404)
        except operate.OnlyV1 as exc:
            return JSONResponse({"error": str(exc), "schema": "v1"}, status_code=409)
        except (SchemaError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        except redis.RedisError as exc:
            return unavailable(exc)
        return JSONResponse(result)


def create_app(dashboard: Dashboard) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        dashboard.hub.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            dashboard.hub.stop()
            dashboard.close()

    routes = [
        Route("/", dashboard.index),
        Route("/breakers/{name:path}", dashboard.breaker_page),
        Route("/api/config", dashboard.config),
        Route("/api/events", dashboard.events),
        Route("/api/breakers/{name:path}/actions/{action}", dashboard.action,
              methods=["POST"]),
        Route("/api/breakers/{name:path}", dashboard.detail),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
