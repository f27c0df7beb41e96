"""What the sync and asyncio registries share: one instance per name, built from specs.

The registry keeps one component per (kind, name) for the life of the process
and builds it through the component's public constructor with the registry's
one Redis client. Keyed instances (``registry.breaker("llm", key=tenant)``) are
named ``<name>:<key>``, take the config of `name` and are kept in a bounded LRU
(`max_keyed` per kind: their state lives in Redis, so one rebuilt after being
dropped only pays one round trip to learn it again). No I/O here.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from .._runtime.keys import validate_name
from .config import KINDS, InstanceSpec, RegistryConfigError, RegistrySpec, load_file
from .health import plan

if TYPE_CHECKING:
    from typing_extensions import Self

ComponentHook = Callable[[str, Any], None]

# The component classes of a flavour, so a lookup is typed as what it returns
# (`@registry.breaker("payments")` keeps the decorated function's signature).
BreakerT = TypeVar("BreakerT")
BulkheadT = TypeVar("BulkheadT")
BudgetT = TypeVar("BudgetT")
RetryT = TypeVar("RetryT")
PolicyT = TypeVar("PolicyT")
LimiterT = TypeVar("LimiterT")
PoolT = TypeVar("PoolT")


@dataclasses.dataclass(frozen=True)
class Classes:
    """The component classes a registry builds: the sync ones or the asyncio ones."""

    breaker: type
    bulkhead: type
    budget: type
    retry: type
    policy: type
    rate_limiter: type
    pool: type


def keyed_name(name: str, key: Any) -> str:
    """The component name of `name`'s instance for `key` (``<name>:<key>``)."""
    if key is None:
        return name
    text = str(key)
    if not text:
        raise ValueError(f"key of {name!r} must not be empty")
    return validate_name(f"{name}:{text}")


def client_for(spec: RegistrySpec, redis: Any, make: Any) -> Any:
    """The registry's one client: `redis` if given, else from the config's `redis` URL."""
    target = redis if redis is not None else spec.redis
    if target is not None and not isinstance(target, str) and redis is None:
        raise RegistryConfigError(spec.source, "redis", None,
                                  f"must be a URL string, got {target!r}")
    try:
        return make(target, spec.redis_timeout)
    except (TypeError, ValueError) as error:
        raise RegistryConfigError(spec.source, "redis", None, str(error)) from None


class RegistryCore(Generic[BreakerT, BulkheadT, BudgetT, RetryT, PolicyT, LimiterT, PoolT]):
    """Named components, each built once; `client` is shared by all of them.

    Each flavour sets `CLASSES` (its components) and `make_client(target, timeout)`.
    """

    CLASSES: Classes
    make_client: Callable[[Any, float], Any]

    def __init__(self, config: Mapping[str, Any] | RegistrySpec | None = None, *,
                 redis: Any = None, environ: Mapping[str, str] | None = None,
                 source: str = "<dict>", strict: bool = False) -> None:
        spec = config if isinstance(config, RegistrySpec) else RegistrySpec(
            config or {}, source=source, environ=environ)
        #: What the client was built from (a URL, or the client given).
        self.redis = redis if redis is not None else spec.redis
        self._owns_client = redis is None or isinstance(redis, str)
        self.spec = spec
        self._client = client_for(spec, redis, type(self).make_client)
        self._classes = self.CLASSES
        self._lock = threading.RLock()
        self._named: dict[tuple[str, str], Any] = {}
        self._keyed: dict[str, OrderedDict[str, Any]] = {kind: OrderedDict() for kind in KINDS}
        self._hooks: list[ComponentHook] = []
        #: Check every declared component against Redis when built (sync: `check()`).
        self.strict = strict

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, redis: Any = None,
                  environ: Mapping[str, str] | None = None, strict: bool = False) -> Self:
        """A registry from a mapping (environment overrides from `environ`, default
        ``os.environ``)."""
        return cls(data, redis=redis, environ=environ, strict=strict)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, redis: Any = None,
                  environ: Mapping[str, str] | None = None, strict: bool = False) -> Self:
        """A registry from a ``.yaml`` / ``.yml`` (needs PyYAML), ``.toml`` or ``.json`` file."""
        return cls(load_file(path), redis=redis, environ=environ, source=str(path),
                   strict=strict)

    @property
    def client(self) -> Any:
        """The one Redis client every component of this registry uses."""
        return self._client

    @property
    def source(self) -> str:
        """Where the configuration came from (a file path, or ``<dict>``)."""
        return self.spec.source

    # -- lookups ------------------------------------------------------------------------------
    def breaker(self, name: str, *, key: Any = None) -> BreakerT:
        """The breaker `name` (for `key`: its own breaker with `name`'s config)."""
        return cast(BreakerT, self._get("breaker", name, key))

    def bulkhead(self, name: str, *, key: Any = None) -> BulkheadT:
        return cast(BulkheadT, self._get("bulkhead", name, key))

    def budget(self, name: str, *, key: Any = None) -> BudgetT:
        return cast(BudgetT, self._get("budget", name, key))

    def rate_limiter(self, name: str, *, key: Any = None) -> LimiterT:
        """The rate limiter `name` (for `key`: its own limiter with `name`'s config; or
        one limiter's ``acquire(key=...)``, which shares its object)."""
        return cast(LimiterT, self._get("rate_limiter", name, key))

    def pool(self, name: str) -> PoolT:
        """The pool `name` (its members and outlier detection from the `pools:` section)."""
        return cast(PoolT, self._get("pool", name, None))

    def retry(self, name: str) -> RetryT:
        """The Retry `name` (no key: a Retry keeps no state of its own)."""
        return cast(RetryT, self._get("retry", name, None))

    def policy(self, name: str, *, key: Any = None) -> PolicyT:
        """The policy `name`; with `key`, each of its components is `key`'s instance."""
        return cast(PolicyT, self._get("policy", name, key))

    def declared(self, kind: str) -> list[str]:
        """Names the configuration declares under `kind`'s instances."""
        return sorted(self.spec.instances[kind])

    def components(self) -> Iterator[tuple[str, Any]]:
        """(kind, component) of every unkeyed instance: declared ones (built now) and
        those built since by name."""
        for kind in KINDS:
            for name in self.declared(kind):
                self._get(kind, name, None)
        with self._lock:
            items = list(self._named.items())
        for (kind, _), component in items:
            yield kind, component

    def built(self) -> list[Any]:
        """Every component built so far, named and keyed (what `close` closes)."""
        with self._lock:
            return [*self._named.values(),
                    *(c for table in self._keyed.values() for c in table.values())]

    def on_component(self, hook: ComponentHook) -> None:
        """Call ``hook(kind, component)`` for every component built so far and from now on
        (an integration instruments them this way, e.g. OpenTelemetry)."""
        with self._lock:
            self._hooks.append(hook)
            built = [(kind, c) for (kind, _), c in self._named.items()]
            built += [(kind, c) for kind, table in self._keyed.items() for c in table.values()]
        for kind, component in built:
            hook(kind, component)

    # -- building ---------------------------------------------------------------------------
    def _get(self, kind: str, name: str, key: Any) -> Any:
        if not isinstance(name, str):
            raise TypeError(f"{kind} name must be a str, got {name!r}")
        if key is None:
            component = self._named.get((kind, name))
            if component is not None:
                return component
            with self._lock:
                component = self._named.get((kind, name))
                if component is None:
                    component = self._named[(kind, name)] = self._build(kind, name, None)
                    self._announce(kind, component)
                return component
        full = keyed_name(name, key)
        with self._lock:
            table = self._keyed[kind]
            component = table.get(full)
            if component is not None:
                table.move_to_end(full)
                return component
            component = table[full] = self._build(kind, name, key)
            if len(table) > self.spec.max_keyed:
                table.popitem(last=False)
            self._announce(kind, component)
            return component

    def _announce(self, kind: str, component: Any) -> None:
        for hook in list(self._hooks):
            hook(kind, component)

    def _build(self, kind: str, name: str, key: Any) -> Any:
        spec = self.spec.resolve(kind, name)
        full = keyed_name(name, key)
        classes, prefix = self._classes, self.spec.prefix
        try:
            if kind == "retry":
                budget = spec.options.get("budget")
                return classes.retry(spec.config, budget=(
                    self.budget(budget) if isinstance(budget, str) else None))
            if kind == "policy":
                return self._build_policy(spec, full, key)
            cls = getattr(classes, kind)
            return cls(full, redis=self._client, config=spec.config, prefix=prefix)
        except RegistryConfigError:
            raise
        except (TypeError, ValueError) as error:
            section = KINDS[kind].section
            raise RegistryConfigError(self.spec.source, f"{section}.instances.{name}", None,
                                      f"cannot build {kind} {full!r}: {error}") from error

    def _part(self, spec: InstanceSpec, part: str, key: Any, default: Any) -> Any:
        ref = spec.options.get(part, default)
        if ref is None or ref is False:
            return None
        target = spec.name if ref is True else ref
        if part == "retry":
            if isinstance(ref, Mapping):
                return self._classes.retry(self.spec.inline_retry(spec.name, ref),
                                           budget=None)
            if ref is True and target not in self.spec.instances["retry"]:
                return self._classes.retry()
            return self.retry(target)
        return self._get(part, target, key)

    def _build_policy(self, spec: InstanceSpec, full: str, key: Any) -> Any:
        options = spec.options
        return self._classes.policy(
            full, redis=self._client,
            breaker=self._part(spec, "breaker", key, True),
            bulkhead=self._part(spec, "bulkhead", key, None),
            budget=self._part(spec, "budget", key, None),
            rate_limiter=self._part(spec, "rate_limiter", key, None),
            retry=self._part(spec, "retry", key, None),
            fallback=options.get("fallback"),
            fallback_on_client_error=options.get("fallback_on_client_error", False),
            http_classifier=_classifier(options.get("http_classifier")),
            prefix=self.spec.prefix, redis_timeout=self.spec.redis_timeout)

    def health_plans(self) -> list[tuple[int, Any]]:
        """(id, probe) of every unkeyed breaker, bulkhead, budget, rate limiter, policy and
        pool, in that order (a component shared by policies is read once per report)."""
        order = {kind: i for i, kind in enumerate(KINDS)}
        items = sorted((pair for pair in self.components() if pair[0] != "retry"),
                       key=lambda pair: order[pair[0]])
        plans = []
        for kind, component in items:
            critical, when_open = self._readiness(kind, component.name)
            plans.append((id(component),
                          plan(component, critical, self._critical_part, when_open)))
        return plans

    def _readiness(self, kind: str, name: str) -> tuple[bool, bool]:
        spec = self.spec.resolve(kind, name)
        return spec.critical, spec.fail_readiness_when_open

    def _critical_part(self, kind: str, name: str) -> tuple[bool, bool]:
        base = name.split(":", 1)[0] if name not in self.spec.instances[kind] else name
        return self._readiness(kind, base)

    def critical(self, kind: str, name: str) -> bool:
        """Whether `name` is declared critical (readiness fails while this process cannot
        serve it; with ``fail_readiness_when_open``, also while it is OPEN)."""
        return self.spec.resolve(kind, name).critical

    def names(self) -> dict[str, list[str]]:
        """Built unkeyed instances by kind."""
        with self._lock:
            out: dict[str, list[str]] = {kind: [] for kind in KINDS}
            for kind, name in self._named:
                out[kind].append(name)
        return {kind: sorted(names) for kind, names in out.items()}


def _classifier(table: Any) -> Any:
    if table is None:
        return None
    from .._runtime.classify import HttpClassifier

    return HttpClassifier(table)
