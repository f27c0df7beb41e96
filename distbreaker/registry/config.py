"""Registry configuration: a dict, YAML or TOML file in Resilience4j's shape, validated.

```yaml
redis: ${REDIS_URL}                   # or redis://host:6379/0, memory://
breakers:
  configs:
    default: {failure_rate_threshold: 50, wait_duration_in_open_state: 30s}
  instances:
    payments: {base_config: default, minimum_number_of_calls: 10, critical: true}
bulkheads: {instances: {payments: {max_concurrent_calls: 25,
                                   adaptive: {min_limit: 2, max_limit: 50}}}}
budgets:   {instances: {payments: {percent_can_retry: 0.2}}}
rate_limiters: {instances: {llm: {limit_for_period: 100000, limit_refresh_period: 1m}}}
pools:     {instances: {payments-hosts: {members: [10.0.0.1:80, 10.0.0.2:80], consecutive_5xx: 3}}}
retries:   {instances: {payments: {max_attempts: 3, budget: payments}}}
policies:  {instances: {payments: {breaker: payments, bulkhead: payments,
                                   budget: payments, retry: {max_attempts: 3}},
                        llm: {rate_limiter: llm}}}
```

Field names are the config dataclasses' (`BreakerConfig`, `BulkheadConfig`,
`BudgetConfig`, `RateLimiterConfig`, `RetryConfig`). As in Resilience4j, a config named ``default``
is the base of every instance without `base_config` and of every name the
file does not declare; a config may have a `base_config` of its own.
Durations are numbers of seconds or strings (``500ms``, ``30s``, ``1m30s``,
``1h``, ISO 8601 ``PT30S``: `_runtime.options.to_seconds`, the one parser);
exception classes and predicates are dotted import paths
(``requests.exceptions.ConnectionError``, ``TimeoutError``). ``${VAR}`` (or
``${VAR:-default}``) in any string is replaced from the environment.

Environment variables ``DISTBREAKER_<KIND>_<NAME>_<FIELD>`` (KIND one of
BREAKER, BULKHEAD, BUDGET, RATE_LIMITER, RETRY, POLICY, POOL; the name upper-cased with every
character other than a letter or digit as ``_``) override the file, e.g.
``DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_NUMBER_OF_CALLS=4``. The longest
field name that ends the variable wins. NAME ``DEFAULT`` overrides
``configs.default`` (the base config). A variable that looks like ours but names
no kind, no field or a near-miss of a declared instance is an error naming the
nearest valid one. ``redis`` falls back to ``DISTBREAKER_REDIS_URL`` then
``REDIS_URL``. Setting names may be camelCase or kebab-case, and Resilience4j's
own names are aliases (``R4J_ALIASES``).

Everything is checked when the registry is built, and every error is a
`RegistryConfigError` naming the source (file), the instance and the field.
No I/O here but reading the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.options import alias_of, parse_duration, suggest_field
from ..breaker.config import BreakerConfig
from ..budget.config import BudgetConfig
from ..bulkhead.adaptive import AdaptiveLimit
from ..bulkhead.config import BulkheadConfig
from ..pool.config import PoolConfig
from ..ratelimiter.config import RateLimiterConfig
from ..retry.config import RetryConfig

ENV_PREFIX = "DISTBREAKER_"
DEFAULT_CONFIG = "default"
#: Fields every instance may have besides its component's own.
COMMON_FIELDS = ("base_config", "critical", "fail_readiness_when_open")
TOP_LEVEL = ("redis", "prefix", "redis_timeout", "max_keyed")
DEFAULT_MAX_KEYED = 10_000


class RegistryConfigError(ValueError):
    """A bad registry configuration; `source`, `path` (e.g. ``breakers.instances.payments``)
    and `field` say where."""

    def __init__(self, source: str, path: str, field: str | None, problem: str) -> None:
        self.source = source
        self.path = path
        self.field = field
        self.problem = problem
        where = f"{path}.{field}" if field else path
        super().__init__(f"{source}: {where}: {problem}" if where else f"{source}: {problem}")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of component: its section in the file, its config class, its env word."""

    name: str          # "breaker"
    section: str       # "breakers"
    config_cls: type | None
    extra: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return self.name.upper()

    def fields(self) -> dict[str, str]:
        """Field name -> annotation text (the dataclass's, plus the registry's own)."""
        found = {f.name: str(f.type) for f in dataclasses.fields(self.config_cls)} if (
            self.config_cls is not None) else {}
        found.update({"base_config": "str", "critical": "bool",
                      "fail_readiness_when_open": "bool"})
        found.update({name: _POLICY_FIELDS.get(name, "str") for name in self.extra})
        return found


_POLICY_FIELDS = {"breaker": "ref", "bulkhead": "ref", "budget": "ref", "retry": "ref",
                  "rate_limiter": "ref",
                  "fallback": "Callable", "fallback_on_client_error": "bool",
                  "http_classifier": "mapping"}

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("breaker", "breakers", BreakerConfig),
    Kind("bulkhead", "bulkheads", BulkheadConfig),
    Kind("budget", "budgets", BudgetConfig),
    Kind("rate_limiter", "rate_limiters", RateLimiterConfig),
    Kind("retry", "retries", RetryConfig, ("budget",)),
    Kind("policy", "policies", None, tuple(_POLICY_FIELDS)),
    Kind("pool", "pools", PoolConfig),
)}
_BY_SECTION = {k.section: k for k in KINDS.values()}


@dataclasses.dataclass(frozen=True)
class InstanceSpec:
    """One resolved instance: its kind, name, built config (policies: their fields)."""

    kind: str
    name: str
    config: Any
    critical: bool = False
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    declared: bool = True
    #: Opt-in: readiness also fails while the breaker is OPEN / FORCED_OPEN (fleet state).
    fail_readiness_when_open: bool = False


# -- reading -----------------------------------------------------------------------------
def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping a YAML, TOML or JSON file holds (chosen by its suffix)."""
    file = Path(path)
    source = str(file)
    suffix = file.suffix.lower()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise RegistryConfigError(source, "", None, f"cannot read the file: {error}") from None
    try:
        if suffix in (".yaml", ".yml"):
            data = _yaml().safe_load(text)
        elif suffix == ".toml":
            data = _tomllib().loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise RegistryConfigError(source, "", None, f"unknown file type {suffix!r} "
                                      "(use .yaml, .yml, .toml or .json)")
    except RegistryConfigError:
        raise
    except Exception as error:  # the parser's own syntax errors, with their line numbers
        raise RegistryConfigError(source, "", None, f"not valid {suffix[1:].upper()}: "
                                  f"{error}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RegistryConfigError(source, "", None, "the file must hold a mapping at the top")
    return data


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ImportError("reading a YAML registry file needs PyYAML: "
                          "pip install 'distbreaker[yaml]'") from None
    return yaml


def _tomllib() -> Any:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ImportError("reading a TOML registry file on Python 3.10 needs tomli: "
                              "pip install 'distbreaker[toml]'") from None
    return tomllib


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(value: Any, environ: Mapping[str, str], source: str, path: str) -> Any:
    """`value` with ``${VAR}`` / ``${VAR:-default}`` replaced in every string, recursively."""
    if isinstance(value, str):
        def replace(match: re.Match[str]) -> str:
            name, default = match.groups()
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise RegistryConfigError(source, path, None,
                                      f"environment variable {name} is not set")
        return _VAR.sub(replace, value)
    if isinstance(value, dict):
        return {k: expand(v, environ, source, f"{path}.{k}" if path else str(k))
                for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, environ, source, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


# -- converting one field ------------------------------------------------------------------
def env_name(name: str) -> str:
    """A component name as it appears in an environment variable."""
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def import_object(text: str) -> Any:
    """The object a dotted path names (a bare name: a builtin, e.g. ``TimeoutError``)."""
    module, _, attr = text.strip().rpartition(".")
    try:
        return getattr(importlib.import_module(module or "builtins"), attr)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"cannot import {text!r}") from None


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(value: Any) -> bool:
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, bool):
        return value
    raise ValueError(f"must be true or false, got {value!r}")


def _number(value: Any, kind: type) -> Any:
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            raise ValueError(f"must be {'an integer' if kind is int else 'a number'}, "
                             f"got {value!r}") from None
    return value


def _exceptions(value: Any) -> tuple[Any, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"must be a list of exception class paths, got {value!r}")
    return tuple(import_object(item) if isinstance(item, str) else item for item in items)


def _mapping(value: Any) -> Any:
    if isinstance(value, str):  # from the environment: JSON
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"must be a mapping (JSON in the environment), got {value!r}") \
                from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping, got {value!r}")
    return {int(k) if isinstance(k, str) and k.strip().isdigit() else k: v
            for k, v in value.items()}


def _ref(value: Any) -> Any:
    """A policy's component: a name, true (the policy's own name), false, or a mapping
    (from the environment: a JSON object, e.g. ``{"max_attempts": 3}``)."""
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return _bool(value)
    if isinstance(value, str) and value.strip().startswith("{"):
        return _mapping(value)
    if value is None or isinstance(value, (bool, str, dict)):
        return value
    raise ValueError(f"must be an instance name, true, false or a mapping, got {value!r}")


def _adaptive(value: Any) -> AdaptiveLimit | None:
    """A bulkhead's `adaptive:` setting: a mapping of AdaptiveLimit's fields (JSON in the
    environment; values may be strings, as ``${VAR}`` makes them), or true for the
    defaults, false for a fixed limit."""
    if isinstance(value, AdaptiveLimit):
        return value
    if isinstance(value, bool) or (isinstance(value, str)
                                   and value.strip().lower() in _TRUE | _FALSE):
        return AdaptiveLimit() if _bool(value) else None
    settings = _mapping(value)
    known = {f.name: str(f.type) for f in dataclasses.fields(AdaptiveLimit)}
    fields = {}
    for key, item in settings.items():
        if key not in known:
            raise ValueError(f"has an unknown setting {key!r} (known: {', '.join(known)})")
        try:
            fields[key] = convert(known[key], item)
        except ValueError as error:
            raise ValueError(f"{key} {error}") from None
    return AdaptiveLimit(**fields)


def _shadows(value: Any) -> dict[str, dict[str, Any]]:
    """A breaker's `shadow:` (docs/guides/shadow.md): candidate name -> the settings that
    differ from the breaker's, named and converted as the breaker's own (JSON in the
    environment)."""
    kind = KINDS["breaker"]
    known = kind.fields()
    found: dict[str, dict[str, Any]] = {}
    for name, settings in _mapping(value).items():
        if not isinstance(settings, Mapping):
            raise ValueError(f"{name!r} must be a mapping of breaker settings, got {settings!r}")
        fields: dict[str, Any] = {}
        for given, item in settings.items():
            field = canonical_field(kind, str(given))
            if field is None or field == "shadow":
                raise ValueError(f"{name!r}: unknown breaker setting {given!r}")
            try:
                fields[field] = convert(known[field], item)
            except ValueError as error:
                raise ValueError(f"{name!r}: {field} {error}") from None
        found[str(name)] = fields
    return found


def convert(annotation: str, value: Any) -> Any:
    """One field's value from a file or the environment, by the field's annotation."""
    optional = "None" in annotation
    if value is None or (optional and isinstance(value, str) and value.strip().lower()
                         in ("none", "null", "")):
        if optional or annotation in ("ref", "Callable"):
            return None
        raise ValueError("must not be empty")
    if annotation.startswith("AdaptiveLimit"):
        return _adaptive(value)
    if annotation == "ref":
        return _ref(value)
    if annotation == "Shadows":
        return _shadows(value)
    if annotation == "mapping" or "HttpClassifier" in annotation:
        return _mapping(value)
    if "Seconds" in annotation:
        return parse_duration(value, "value")
    if "type[BaseException]" in annotation:
        return _exceptions(value)
    if "Callable" in annotation:
        return import_object(value) if isinstance(value, str) else value
    base = annotation.replace("| None", "").strip()
    if base == "bool":
        return _bool(value)
    if base == "int":
        return _number(value, int)
    if base == "float":
        return _number(value, float)
    return value


#: First words after DISTBREAKER_ that distbreaker (or its tests and clients) uses for
#: things other than components: never judged as typos of a kind.
_OTHER_WORDS = frozenset({"REDIS", "REGISTRY", "LUA", "DASHBOARD", "CELERY", "CHAOS", "SOAK",
                          "SCREENSHOT", "ON", "PREFIX", "SCHEMA", "ARGS"})


def _did_you_mean(suggestion: str | None) -> str:
    return f"; did you mean {suggestion}?" if suggestion else ""


def _nearest_field(kind: Kind, rest: str) -> str | None:
    """The variable a DISTBREAKER_<KIND>_<rest> with a misspelt setting most likely meant:
    each split of `rest` into NAME_SETTING, the setting closest to a known one."""
    parts = rest.split("_")
    best: tuple[float, str] | None = None
    fields = [f.upper() for f in kind.fields()]
    for i in range(1, len(parts)):
        name, tail = "_".join(parts[:i]), "_".join(parts[i:])
        for match in difflib.get_close_matches(tail, fields, n=1, cutoff=0.6):
            score = difflib.SequenceMatcher(None, tail, match).ratio()
            if best is None or score > best[0]:
                best = (score, f"{ENV_PREFIX}{kind.env}_{name}_{match}")
    return best[1] if best else None


def canonical_field(kind: Kind, field: str) -> str | None:
    """The setting `field` names: itself, its snake_case form, or a Resilience4j alias."""
    known = kind.fields()
    if field in known:
        return field
    named = alias_of(kind.name, field)
    return named if named in known else None


# -- the whole configuration -----------------------------------------------------------------
@dataclasses.dataclass
class _Section:
    kind: Kind
    configs: dict[str, dict[str, Any]]
    instances: dict[str, dict[str, Any]]


class RegistrySpec:
    """A validated registry configuration; `resolve(kind, name)` gives an instance's spec."""

    def __init__(self, data: Mapping[str, Any], *, source: str = "<dict>",
                 environ: Mapping[str, str] | None = None) -> None:
        self.source = source
        environ = os.environ if environ is None else environ
        if not isinstance(data, Mapping):
            raise RegistryConfigError(source, "", None,
                                      f"the configuration must be a mapping, got {data!r}")
        data = expand(dict(data), environ, source, "")
        unknown = sorted(set(data) - set(TOP_LEVEL) - set(_BY_SECTION))
        if unknown:
            raise RegistryConfigError(source, unknown[0], None, "unknown section (expected "
                                      f"{', '.join((*TOP_LEVEL, *_BY_SECTION))})")
        # the file's redis, else the environment's (the CLI's order); `redis=` wins over both
        self.redis: Any = data.get("redis") or environ.get("DISTBREAKER_REDIS_URL") \
            or environ.get("REDIS_URL") or None
        self.prefix = self._top(data, "prefix", DEFAULT_PREFIX, str)
        self.redis_timeout = self._timeout(data)
        self.max_keyed = self._top(data, "max_keyed", DEFAULT_MAX_KEYED, int)
        self._sections = {k.name: self._section(data.get(k.section), k) for k in KINDS.values()}
        self._env = self._environment(environ)
        for kind in KINDS.values():  # every named config is checked, used or not
            for name in self._sections[kind.name].configs:
                path = f"{kind.section}.configs.{name}"
                settings = self._chain(kind.name, name, path)
                if kind.config_cls is not None:
                    self._build(kind, {k: v for k, v in settings.items()
                                       if k not in (*COMMON_FIELDS, *kind.extra)}, path)
        self.instances: dict[str, dict[str, InstanceSpec]] = {
            kind: {name: self.resolve(kind, name) for name in section.instances}
            for kind, section in self._sections.items()}
        self._check_references()

    # -- top level ------------------------------------------------------------------------
    def _top(self, data: Mapping[str, Any], key: str, default: Any, kind: type) -> Any:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise RegistryConfigError(self.source, key, None,
                                      f"must be a {kind.__name__}, got {value!r}")
        return value

    def _timeout(self, data: Mapping[str, Any]) -> float:
        try:
            seconds = parse_duration(data.get("redis_timeout", 0.25), "redis_timeout")
        except ValueError as error:
            raise RegistryConfigError(self.source, "redis_timeout", None, str(error)) from None
        if seconds <= 0:
            raise RegistryConfigError(self.source, "redis_timeout", None, "must be > 0")
        return seconds

    def _section(self, raw: Any, kind: Kind) -> _Section:
        path = kind.section
        if raw is None:
            return _Section(kind, {}, {})
        if not isinstance(raw, Mapping):
            raise RegistryConfigError(self.source, path, None, "must be a mapping with "
                                      "'configs' and/or 'instances'")
        unknown = sorted(set(raw) - {"configs", "instances"})
        if unknown:
            raise RegistryConfigError(self.source, f"{path}.{unknown[0]}", None,
                                      "unknown key (expected 'configs' or 'instances')")
        parts = {}
        for part in ("configs", "instances"):
            entries = raw.get(part) or {}
            if not isinstance(entries, Mapping):
                raise RegistryConfigError(self.source, f"{path}.{part}", None,
                                          "must be a mapping of names to settings")
            parts[part] = {str(name): self._fields(kind, f"{path}.{part}.{name}", fields)
                           for name, fields in entries.items()}
        return _Section(kind, parts["configs"], parts["instances"])

    def _fields(self, kind: Kind, path: str, raw: Any) -> dict[str, Any]:
        """One mapping of settings, every value converted; errors name the field."""
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise RegistryConfigError(self.source, path, None,
                                      f"must be a mapping of settings, got {raw!r}")
        known = kind.fields()
        out: dict[str, Any] = {}
        for given, value in raw.items():
            given = str(given)
            field = canonical_field(kind, given)
            if field is None:
                close = suggest_field(kind.name, given, known)
                raise RegistryConfigError(self.source, path, given,
                                          f"unknown {kind.name} setting"
                                          + _did_you_mean(repr(close) if close else None))
            if field in out:
                raise RegistryConfigError(self.source, path, given,
                                          f"sets {field!r} a second time (an alias of it is "
                                          "given too)")
            out[field] = self._convert(known[field], value, path, field)
        return out

    def _convert(self, annotation: str, value: Any, path: str, field: str) -> Any:
        try:
            return convert(annotation, value)
        except ValueError as error:
            problem = str(error).replace("value must", "must")
            raise RegistryConfigError(self.source, path, field, problem) from None

    # -- environment ------------------------------------------------------------------------
    def _environment(self, environ: Mapping[str, str]) -> dict[str, dict[str, dict[str, Any]]]:
        """{kind: {ENV_NAME: {field: value}}} from DISTBREAKER_<KIND>_<NAME>_<FIELD>;
        NAME ``DEFAULT`` overrides ``configs.default`` (the base config; created when the
        file has none) unless the file declares an instance named ``default``. A variable
        that looks like ours but names no kind, no setting, or a name one typo away from a
        declared instance is an error naming the nearest valid variable."""
        found: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        for variable, value in sorted(environ.items()):
            if not variable.startswith(ENV_PREFIX):
                continue
            rest = variable[len(ENV_PREFIX):]
            kind = next((k for k in KINDS.values() if rest.startswith(f"{k.env}_")), None)
            if kind is None:
                self._check_kind_word(variable, rest)
                continue
            rest = rest[len(kind.env) + 1:]
            known = kind.fields()
            field = max((f for f in known if rest.endswith(f"_{f.upper()}")
                         and len(rest) > len(f) + 1), key=len, default=None)
            if field is None:
                raise RegistryConfigError(
                    self.source, f"environment variable {variable}", None,
                    f"names no {kind.name} setting (expected {ENV_PREFIX}{kind.env}_<NAME>_"
                    f"<SETTING>){_did_you_mean(_nearest_field(kind, rest))}")
            name = rest[:-len(field) - 1]
            section = self._sections[kind.name]
            declared = {env_name(n): n for n in section.instances}
            if name == env_name(DEFAULT_CONFIG) and name not in declared:
                path = f"{kind.section}.configs.{DEFAULT_CONFIG} (from {variable})"
                section.configs.setdefault(DEFAULT_CONFIG, {})[field] = self._convert(
                    known[field], value, path, field)
                continue
            if name not in declared:
                close = difflib.get_close_matches(name, list(declared), n=1, cutoff=0.8)
                if close:
                    meant = f"{ENV_PREFIX}{kind.env}_{close[0]}_{field.upper()}"
                    raise RegistryConfigError(
                        self.source, f"environment variable {variable}", None,
                        f"names no declared {kind.name} ({kind.section}.instances has no "
                        f"{name.lower()!r}){_did_you_mean(meant)} (to configure an undeclared "
                        f"{kind.name} so close to a declared one, declare it in the file: "
                        f"{kind.section}.instances.{name.lower()}: {{}})")
            path = f"{kind.section}.instances.<{name}> (from {variable})"
            found[kind.name].setdefault(name, {})[field] = self._convert(
                known[field], value, path, field)
        return found

    def _check_kind_word(self, variable: str, rest: str) -> None:
        """A DISTBREAKER_ variable whose first word is almost a kind (BREAKERS, BREAKR) is a
        typo of ours: an error naming the kind. Other words (REDIS_URL, REGISTRY, your own)
        are not ours to judge."""
        word = rest.split("_", 1)[0]
        if word in _OTHER_WORDS:
            return
        words = {**{k.env: k for k in KINDS.values()},
                 **{k.section.upper(): k for k in KINDS.values()}}
        close = difflib.get_close_matches(word, list(words), n=1, cutoff=0.8)
        if close:
            kind = words[close[0]]
            fixed = f"{ENV_PREFIX}{kind.env}{rest[len(word):]}"
            raise RegistryConfigError(self.source, f"environment variable {variable}", None,
                                      f"names no kind of component{_did_you_mean(fixed)} "
                                      f"(kinds: {', '.join(k.env for k in KINDS.values())})")

    # -- resolving an instance ----------------------------------------------------------------
    def _chain(self, kind: str, name: str, path: str,
               seen: tuple[str, ...] = ()) -> dict[str, Any]:
        """A named config's settings, its base_config's beneath them."""
        configs = self._sections[kind].configs
        if name not in configs:
            raise RegistryConfigError(self.source, path, "base_config",
                                      f"no {KINDS[kind].section}.configs.{name}")
        if name in seen:
            raise RegistryConfigError(self.source, path, "base_config",
                                      f"cycle: {' -> '.join((*seen, name))}")
        own = dict(configs[name])
        base = own.pop("base_config", None)
        under = (self._chain(kind, base, f"{KINDS[kind].section}.configs.{name}",
                             (*seen, name)) if base is not None else {})
        return {**under, **own}

    def resolve(self, kind: str, name: str) -> InstanceSpec:
        """The spec of instance `name` (declared or not: then the default config applies)."""
        if kind in getattr(self, "instances", {}) and name in self.instances[kind]:
            return self.instances[kind][name]
        section = self._sections[kind]
        declared = name in section.instances
        path = f"{section.kind.section}.instances.{name}"
        own = {**section.instances.get(name, {}), **self._env[kind].get(env_name(name), {})}
        base = own.pop("base_config", None)
        if base is None and DEFAULT_CONFIG in section.configs:
            base = DEFAULT_CONFIG
        settings = {**(self._chain(kind, base, path) if base is not None else {}), **own}
        when_open = settings.pop("fail_readiness_when_open", False)
        critical = settings.pop("critical", False) or when_open
        if kind == "policy":
            return InstanceSpec(kind, name, None, critical, settings, declared, when_open)
        options = {k: settings.pop(k) for k in section.kind.extra if k in settings}
        return InstanceSpec(kind, name, self._build(section.kind, settings, path), critical,
                            options, declared, when_open)

    def _build(self, kind: Kind, settings: dict[str, Any], path: str) -> Any:
        assert kind.config_cls is not None
        try:
            return kind.config_cls(**settings)
        except (ValueError, TypeError) as error:
            message = str(error)
            field = next((f for f in sorted(settings, key=len, reverse=True)
                          if message.startswith(f)), None)
            if field is None:
                field = next((f.name for f in dataclasses.fields(kind.config_cls)
                              if message.startswith(f.name)), None)
            if field is not None and message.startswith(field):
                message = message[len(field):].strip()
            raise RegistryConfigError(self.source, path, field, message) from None

    def _check_references(self) -> None:
        """Policies and retries may only name instances that exist (or `true`)."""
        for spec in self.instances["retry"].values():
            budget = spec.options.get("budget")
            path = f"retries.instances.{spec.name}"
            if budget is not None and not isinstance(budget, str):
                raise RegistryConfigError(self.source, path, "budget",
                                          "must be the name of a budget")
            if isinstance(budget, str) and budget not in self.instances["budget"]:
                raise RegistryConfigError(self.source, path, "budget",
                                          f"no budgets.instances.{budget}")
        for spec in self.instances["policy"].values():
            for part in ("breaker", "bulkhead", "budget", "retry", "rate_limiter"):
                ref = spec.options.get(part)
                path = f"policies.instances.{spec.name}"
                if isinstance(ref, dict):
                    if part == "retry":
                        self.inline_retry(spec.name, ref)
                    else:
                        raise RegistryConfigError(self.source, path, part, "must name a "
                                                  f"{part} instance (declare it under "
                                                  f"{KINDS[part].section}.instances)")
                elif isinstance(ref, str) and ref not in self.instances[part]:
                    raise RegistryConfigError(self.source, path, part, f"no "
                                              f"{KINDS[part].section}.instances.{ref}")

    def inline_retry(self, policy: str, fields: Mapping[str, Any]) -> RetryConfig:
        """A policy's inline ``retry: {...}`` as a RetryConfig (validated at load)."""
        path = f"policies.instances.{policy}.retry"
        settings = self._fields(KINDS["retry"], path, fields)
        base = settings.pop("base_config", None)
        settings.pop("critical", None)
        settings.pop("fail_readiness_when_open", None)
        if base is None and DEFAULT_CONFIG in self._sections["retry"].configs:
            base = DEFAULT_CONFIG
        merged = {**(self._chain("retry", base, path) if base else {}), **settings}
        budget = merged.pop("budget", None)
        if budget is not None:
            raise RegistryConfigError(self.source, path, "budget",
                                      "give the policy's budget as policies.instances."
                                      f"{policy}.budget")
        return self._build(KINDS["retry"], merged, path)

