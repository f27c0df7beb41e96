"""What the pool-routing HTTP integrations share, without I/O.

A request addressed to a pool's logical host (``http://payments/v1/charge``) is sent to
the member the pool picks: the member's address (``10.0.0.7:8080``,
``https://eu.api.example.com/base``) replaces the URL's scheme (when it names one),
host and port, and its path prefix goes before the request's path. The answer is
then recorded on that member: the status through the same `HttpClassifier` as the
breaker transports (2xx/3xx a success, 4xx but 429 not the member's fault, 5xx and
429 failures, a 429's Retry-After passed on), a transport error as a failure of the
member (no response at all: a local-origin failure; an error of our own side, such as
an invalid URL: the pick is released, nothing recorded).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._runtime.classify import (
    DEFAULT_HTTP_CLASSIFIER,
    HttpClassifier,
    HttpVerdict,
    parse_retry_after,
)
from ._http import IDEMPOTENT_METHODS

#: How a finished exchange counts for the member that served it (the Pool's outcomes).
SUCCESS, FAILURE, GATEWAY, LOCAL = "success", "5xx", "gateway", "local"


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a member is: the URL parts a request to it gets."""

    scheme: str | None       # None: the request's own scheme
    host: str                # without brackets for IPv6
    port: int | None         # None: the scheme's default
    prefix: str = ""         # a path put before the request's ("" or "/base")

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse_member(address: str) -> Target:
    """A member's address: ``host``, ``host:port``, ``[v6]:port`` or a URL with a scheme
    (``https://host:port/prefix``). Raises ValueError for anything else."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"a member address must be a non-empty string, got {address!r}")
    text = address.strip()
    has_scheme = "://" in text
    parts = urllib.parse.urlsplit(text if has_scheme else f"//{text}")
    if has_scheme and parts.scheme not in ("http", "https"):
        raise ValueError(f"member {address!r}: the scheme must be http or https")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"member {address!r}: only scheme, host, port and a path prefix")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as error:
        raise ValueError(f"member {address!r}: {error}") from None
    if not host:
        raise ValueError(f"member {address!r} names no host")
    if ":" in host:
        ipaddress.IPv6Address(host)   # a bare v6 address must be in brackets to carry a port
    return Target(parts.scheme or None, host, port, parts.path.rstrip("/"))


def rewrite(scheme: str, path: str, target: Target) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path) of a request to `target`; `path` keeps its query."""
    return (target.scheme or scheme, target.host, target.port,
            f"{target.prefix}{path}" if target.prefix else path)


GATEWAY_STATUSES = frozenset((502, 503, 504))


def verdict(status: int, headers: Any,
            classifier: HttpClassifier | None = None) -> tuple[str, float | None]:
    """(the Pool's outcome, seconds to eject the member for or None) of a response.

    `classifier` (default `classify_http`) gives the status its verdict: ``ok`` and
    ``client_error`` are the member answering (a 4xx is the request's fault: Envoy counts
    it as no error either), ``transient`` and ``hard_stop`` its failure: a gateway
    failure for 502/503/504, else a 5xx. A 429 or 503 with a Retry-After ejects the
    member for that long (LiteLLM's cooldown, fleet-wide).
    """
    kind = (classifier or DEFAULT_HTTP_CLASSIFIER).classify(status, headers)
    if kind in (HttpVerdict.OK, HttpVerdict.CLIENT_ERROR):
        return SUCCESS, None
    wait = None
    if status in (429, 503) and headers is not None:   # httpx's and requests' headers
        wait = parse_retry_after(headers.get("Retry-After"))   # ignore the case of names
    return (GATEWAY if status in GATEWAY_STATUSES else FAILURE), wait or None


class Failover:
    """One logical request across members (`failover`): the members tried (each retry's
    pick avoids them), and what the caller gets: the last answer or error."""

    def __init__(self, attempts: int) -> None:
        self.attempts = attempts
        self.tried: list[str] = []
        self.response: Any = None
        self.error: BaseException | None = None

    def fresh(self, member: str) -> bool:
        """True for a member not tried yet (False: the pool had nothing else left)."""
        if member in self.tried:
            return False
        self.tried.append(member)
        return True

    def superseded(self) -> Any:
        """The previous attempt's response, to close (a newer answer came, or an error
        ends the request)."""
        stale, self.response = self.response, None
        return stale

    def answered(self, response: Any, outcome: str) -> bool:
        """True when `response` is the one to hand back (a success, or attempts spent)."""
        self.response, self.error = response, None
        return outcome == SUCCESS or len(self.tried) >= self.attempts

    def failed(self, error: BaseException, outcome: str | None) -> str:
        """What follows `error`: "next" (another member: only after no response at all,
        such as a refused connect or a timeout), "answer" (attempts spent: an earlier
        member's answer is handed back, it says more than a failed connect) or "raise"."""
        self.error = error
        if outcome != LOCAL:
            return "raise"
        if len(self.tried) < self.attempts:
            return "next"
        return "raise" if self.response is None else "answer"

    def result(self) -> Any:
        """The last answer (no other member was left), else the last error raised."""
        if self.response is not None:
            return self.response
        assert self.error is not None
        raise self.error


class Routes:
    """Which pool a request's host routes by: one pool for every request, or a mapping of
    logical host (``payments`` or ``payments:8080``) to pool; other hosts pass through."""

    def __init__(self, pool: Any, key: Callable[[Any], str | None] | None = None,
                 http_classifier: HttpClassifier | Mapping[int, Any] | None = None,
                 failover: int = 0,
                 failover_methods: Iterable[str] | None = IDEMPOTENT_METHODS) -> None:
        if isinstance(failover, bool) or not isinstance(failover, int) or failover < 0:
            raise ValueError(f"failover must be an integer >= 0, got {failover!r}")
        self.failover = failover
        self.failover_methods = (None if failover_methods is None
                                 else frozenset(m.upper() for m in failover_methods))
        if isinstance(pool, Mapping):
            if not pool:
                raise ValueError("pools must name at least one host")
            self.pools: dict[str, Any] | None = {str(k).lower(): v for k, v in pool.items()}
            self.pool = None
        else:
            self.pools, self.pool = None, pool
        for each in ([pool] if self.pools is None else self.pools.values()):
            if not callable(getattr(each, "pick", None)):
                raise TypeError(f"a pool must have pick(), got {each!r}")
        if key is not None and not callable(key):
            raise TypeError("key must be a callable of the request (or None)")
        self.key = key
        if http_classifier is not None and not isinstance(http_classifier, HttpClassifier):
            http_classifier = HttpClassifier(http_classifier)
        self.classifier = http_classifier
        self._targets: dict[str, Target] = {}

    def pool_for(self, host: str, port: int | None) -> Any:
        """The pool of a request to `host`/`port`, or None (sent as it is)."""
        if self.pools is None:
            return self.pool
        host = host.lower()
        if port is not None:
            found = self.pools.get(f"{host}:{port}")
            if found is not None:
                return found
        return self.pools.get(host)

    def target(self, address: str) -> Target:
        """A member's address parsed (once per address)."""
        target = self._targets.get(address)
        if target is None:
            target = self._targets[address] = parse_member(address)
        return target

    def verdict(self, status: int, headers: Any) -> tuple[str, float | None]:
        return verdict(status, headers, self.classifier)

    def attempts(self, method: str, replayable: bool) -> int:
        """How many members a request may be sent to: 1 + `failover` for a method in
        `failover_methods` (None: any) with a body that can be sent again."""
        if not replayable or (self.failover_methods is not None
                              and method.upper() not in self.failover_methods):
            return 1
        return 1 + self.failover

    def key_of(self, request: Any) -> str | None:
        """The request's stickiness key (``key(request)``), or None."""
        return None if self.key is None else self.key(request)

    def error_outcome(self, error: BaseException, transient: tuple[type[BaseException], ...],
                      local: tuple[type[BaseException], ...]) -> str | None:
        """How a request that raised counts: None (release the pick: cancelled, or our own
        side's error), LOCAL (no response: connect, timeout, reset), or "" (let the pool
        classify `error`)."""
        if not isinstance(error, Exception) or isinstance(error, local):
            return None
        if isinstance(error, transient):
            return LOCAL
        return ""


__all__ = ["FAILURE", "GATEWAY", "LOCAL", "SUCCESS", "Failover", "Routes", "Target", "parse_member",
           "rewrite", "verdict"]


def route_request(pool: Any, run: Failover, key: Any, send: Callable[[str], Any],
          error_outcome: Callable[[BaseException], str | None],
          verdict_of: Callable[[Any, str], dict[str, Any]]) -> Any:
    """One request routed by a sync pool, with failover: pick a member, `send(member)`,
    record what happened (`error_outcome(error)` for no response, `verdict_of(response,
    member)` for one), and on a failure `run` allows, record it and pick the next member
    in one script call (`repick`). Returns the answer `run` settles on, or raises."""
    pick = pool.pick(key)
    while True:
        if not run.fresh(pick.member):   # nothing else was left
            pool.release(pick)
            return run.result()
        try:
            response = send(pick.member)
        except BaseException as error:
            outcome = error_outcome(error)
            step = run.failed(error, outcome)
            if step == "next":   # record this one and pick the next: one script call
                pick = pool.repick(pick, error, outcome=outcome, key=key, avoid=run.tried)
                continue
            if outcome is None:
                pool.release(pick)
            else:
                pool.record(pick, error, outcome=outcome or None)
            if step == "answer":
                return run.result()
            stale = run.superseded()
            if stale is not None:
                stale.close()
            raise
        stale = run.superseded()
        if stale is not None:
            stale.close()
        verdict = verdict_of(response, pick.member)
        if run.answered(response, verdict["outcome"]):
            pool.record(pick, **verdict)
            return response
        pick = pool.repick(pick, **verdict, key=key, avoid=run.tried)
