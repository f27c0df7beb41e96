"""`distbreaker doctor`: can this Redis (and this ACL user) run distbreaker?

Checks: Redis version and mode, round-trip latency, that every script in lua/
loads (EVAL form: SCRIPT LOAD; Redis 7+: the Functions library, FUNCTION LOAD, with
every function registered), that the ACL user may run every command on every key and channel the
library needs (ACL DRYRUN on Redis >= 7, nothing executed; the exact ACL SETUSER
line that fixes what is missing), and memory (an evicting maxmemory-policy, used
memory near maxmemory); that the server is a writable primary and a worker's scripts
may run there (`workers`: the same write-free check as a component's `check()`, for
any user that may EVAL). Works for a least-privilege user: a check this user may not
run is skipped, saying so, and the others still run. `--user NAME` checks another
user's permissions from an admin connection (ACL DRYRUN). Exit 1 on a failed check.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import click
from redis.connection import parse_url
from redis.exceptions import NoPermissionError

from .. import readside as view
from .._runtime.connection import db_of
from .._runtime.keys import BreakerKeys, events_channel, namespace
from .._runtime.outages import READ_ONLY
from .._runtime.preflight import CheckFailed, commands_of, preflight, script_commands
from .._runtime.scripts import SCRIPT_NAMES, library, load_script, loaded, lua_dir
from .app import App, cli, emit_json

__all__ = ["acl_checks", "commands_of", "run_checks", "script_commands"]

MIN_VERSION = (5, 0)
LATENCY_WARN_MS = 50.0
#: Used memory above this share of maxmemory is a warning (writes start failing at 100 %).
MEMORY_WARN_SHARE = 0.8
#: Commands the Python side sends itself (scripts run with EVALSHA, EVAL after NOSCRIPT;
#: a bulkhead waiter blocks on BLPOP).
LIBRARY_COMMANDS = ("EVALSHA", "EVAL", "BLPOP", "PING")
#: Commands the library prefers but can do without: on Redis 7+ scripts run as Redis
#: Functions (FCALL, the library loaded with FUNCTION LOAD); a user denied them makes
#: workers fall back to the EVAL form (slower per call), so denial is only a warning.
FUNCTION_COMMANDS = ("FCALL", "FUNCTION|LOAD")
#: Commands only the operator tools send (a worker's user does not need them).
OPERATOR_COMMANDS = ("SCAN", "TYPE", "GET", "GETRANGE", "HGETALL", "HGET", "HMGET", "ZRANGE",
                     "ZRANGEBYSCORE", "ZCOUNT", "ZCARD", "XRANGE", "XREVRANGE", "XLEN", "PTTL",
                     "EXISTS", "TIME", "SUBSCRIBE", "INFO")
@dataclasses.dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _dryrun_args(command: str, arity: int, key: str, channel: str, sha: str) -> list[str]:
    if command in ("PUBLISH", "SUBSCRIBE"):
        return [channel, "x"][: max(1, abs(arity) - 1)]
    if command == "EVALSHA":
        return [sha, "1", key]
    if command == "EVAL":
        return ["return 1", "1", key]
    if command == "FCALL":
        return [load_script("breaker").function, "1", key]
    if command == "FUNCTION|LOAD":
        return ["LOAD", "#!lua name=distbreaker_doctor\nreturn 1"]
    if command == "SCAN":
        return ["0"]
    needed = abs(arity) - 1
    return [key, *["0"] * (needed - 1)][:needed] if needed > 0 else []


def acl_checks(client: Any, prefix: str, version: tuple[int, ...],
               user: str | None = None) -> list[Check]:
    """ACL DRYRUN every needed command as `user` (default: the connected user; another
    user's needs an admin connection), Redis >= 7."""
    if version < (7, 0):
        return [Check("acl", "skip", f"ACL DRYRUN needs Redis >= 7; not checked on "
                      f"{'.'.join(map(str, version))}")]
    try:
        user = user or view.text(client.execute_command("ACL", "WHOAMI"))
        client.execute_command("ACL", "DRYRUN", user, "PING")
    except Exception as exc:  # NOPERM for ACL itself, a user that does not exist, a proxy
        if user is not None and not _refused(exc):
            return [Check("acl", "fail", f"cannot check ACL user {user!r}: {exc}")]
        return [Check("acl", "skip", f"this user may not run ACL DRYRUN ({exc}): the "
                      "commands a worker runs are checked by `workers` instead (run "
                      "`doctor --user NAME` as an admin for the operator commands too)")]
    scripts = script_commands()
    needed = {c: "library" for c in LIBRARY_COMMANDS}
    needed.update((c, "functions") for c in FUNCTION_COMMANDS)
    for script, commands in sorted(scripts.items(), key=lambda item: item[0] == "ganesha"):
        for c in commands:  # Ganesha's own commands last: only a GaneshaBreaker needs them
            needed.setdefault(c, "ganesha" if script == "ganesha" else f"lua/{script}.lua")
    for c in OPERATOR_COMMANDS:
        needed.setdefault(c, "operator")
    #: Each fix line's group, and the groups a command is in (GET: Ganesha's and the tools').
    groups = {c: {_group(u)} for c, u in needed.items()}
    for c in OPERATOR_COMMANDS:
        groups[c].add("operator")
    for c in scripts.get("ganesha", ()):
        groups[c].add("ganesha")
    info = client.execute_command("COMMAND", "INFO", *(c.split("|")[0] for c in needed))
    key = BreakerKeys.build("doctor", prefix).state
    channel = events_channel(prefix, db_of(client))
    sha = load_script("breaker").sha
    denied_lib, denied_ops, denied_fn, denied_gan = [], [], [], []
    grants: dict[str, list[str]] = {"library": [], "operator": [], "ganesha": []}
    for command, used_by in needed.items():
        meta = info.get(command.split("|")[0].lower()) if isinstance(info, dict) else None
        if not meta:
            denied_lib.append(f"{command} (unknown to this server)")
            continue
        args = _dryrun_args(command, int(meta["arity"]), key, channel, sha)
        try:
            answer = view.text(client.execute_command("ACL", "DRYRUN", user,
                                                      command.split("|")[0], *args))
        except Exception as exc:
            answer = str(exc)
        if answer != "OK":
            denied = {"operator": denied_ops, "functions": denied_fn,
                      "ganesha": denied_gan}.get(used_by, denied_lib)
            shown = command.replace("|", " ")
            denied.append(f"{shown} (needed by {used_by}: {answer})")
            grant = _grant(answer, command, prefix, channel)
            for group in groups[command]:
                if grant not in grants[group]:
                    grants[group].append(grant)
    checks = []
    if grants["library"]:  # what a worker needs (Functions included: a warning alone)
        checks.append(Check("acl-fix", "warn" if not denied_lib else "fail",
                            f"ACL SETUSER {user} " + " ".join(grants["library"])))
    if denied_lib:
        checks.append(Check("acl", "fail", f"ACL user {user!r} may not run: "
                            + "; ".join(denied_lib)))
    else:
        checks.append(Check("acl", "ok", f"ACL user {user!r} may run all "
                            f"{sum(1 for v in needed.values() if _group(v) == 'library')} "
                            "commands "
                            f"the library and lua/ scripts need on keys {namespace(prefix)}:*"))
    if denied_fn:
        checks.append(Check("acl-functions", "warn", "Redis Functions denied: workers run the "
                            "EVAL form of the scripts instead (slower per call): "
                            + "; ".join(denied_fn)))
    if denied_ops:
        checks.append(Check("acl-operator", "warn", "operator commands denied (ls/show/events "
                            "need them, workers do not): " + "; ".join(denied_ops)
                            + f"; fix: ACL SETUSER {user} " + " ".join(grants["operator"])))
    if denied_gan:
        checks.append(Check("acl-ganesha", "warn", "a GaneshaBreaker (Ganesha's own keys) "
                            "would be refused: " + "; ".join(denied_gan) + f"; fix: ACL "
                            f"SETUSER {user} ~ganesha_* " + " ".join(
                                g for g in grants["ganesha"] if not g.startswith("~"))))
    return checks


def _group(used_by: str) -> str:
    """Which fix line a command's grant goes to: a worker's, the operator tools', Ganesha's."""
    return used_by if used_by in ("operator", "ganesha") else "library"


def function_check(client: Any, version: tuple[int, ...]) -> Check:
    """Whether this version's Functions library is on the server (loading it when missing,
    as a worker's first call would) with one function per script. Not a failure when it
    cannot be: workers then run the EVAL form, which the script checks cover."""
    lib = library()
    if version < (7, 0):
        return Check("functions", "skip", f"Redis Functions need Redis >= 7: workers run the "
                     f"EVAL form of the scripts on {'.'.join(map(str, version))}")
    try:
        client.function_load(lib.code)
        error = None
    except Exception as exc:
        error = exc
    if not loaded(error):
        return Check("functions", "warn", f"FUNCTION LOAD of library {lib.name} failed "
                     f"({error}): workers run the EVAL form of the scripts instead")
    try:
        listed = client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", lib.name)
    except Exception as exc:
        return Check("functions", "warn", f"library {lib.name} loaded, FUNCTION LIST not "
                     f"permitted ({exc}): its functions not checked")
    names = set(_function_names(listed, lib.name))
    missing = [lib.function(n) for n in SCRIPT_NAMES if lib.function(n) not in names]
    if missing:
        return Check("functions", "fail", f"library {lib.name} lacks "
                     f"{', '.join(missing)}: another library of that name holds other code")
    return Check("functions", "ok", f"library {lib.name} loaded, "
                 f"{len(SCRIPT_NAMES)} functions (FCALL)")


def _function_names(listed: Any, library_name: str) -> list[str]:
    """The function names of `library_name` in a FUNCTION LIST reply (RESP2 flat lists or
    RESP3 maps, bytes or str)."""
    def as_dict(item: Any) -> dict[str, Any]:
        if isinstance(item, dict):
            return {view.text(k): v for k, v in item.items()}
        return {view.text(k): v for k, v in zip(item[::2], item[1::2], strict=False)}

    names: list[str] = []
    for lib in listed or ():
        fields = as_dict(lib)
        if view.text(fields.get("library_name", "")) != library_name:
            continue
        names += [view.text(as_dict(f).get("name", "")) for f in fields.get("functions") or ()]
    return names


def _grant(answer: str, command: str, prefix: str, channel: str) -> str:
    """The ACL rule granting what a DRYRUN answer says is missing."""
    text = answer.lower()
    if "channel" in text:
        return f"&{channel}"
    if "key" in text:
        return f"~{namespace(prefix)}:*"
    return f"+{command.lower()}"  # FUNCTION|LOAD: +function|load, not every subcommand


def _info(client: Any, section: str) -> dict[str, Any] | None:
    """INFO `section`, or None when this user may not run INFO (or a proxy hides it)."""
    try:
        found = client.info(section)
    except Exception:
        return None
    if found and all(isinstance(v, dict) for v in found.values()):
        found = next(iter(found.values()))  # a cluster client's {node: info}
    return found


def _server_without_info(client: Any) -> dict[str, Any]:
    """Version and mode from HELLO, for a user without INFO permission."""
    try:
        hello = client.execute_command("HELLO")
    except Exception:
        return {}
    if isinstance(hello, list):
        hello = dict(zip(hello[::2], hello[1::2], strict=False))
    fields = {view.text(k): v for k, v in dict(hello).items()}
    return {"redis_version": view.text(fields.get("version", "0")),
            "redis_mode": view.text(fields.get("mode", "standalone"))}


def memory_checks(client: Any) -> list[Check]:
    """Whether Redis may evict distbreaker keys, or is about to refuse writes."""
    memory = _info(client, "memory")
    if memory is None:
        return [Check("memory", "skip", "INFO memory not permitted: eviction policy and "
                      "memory use not checked (see docs/OPERATIONS.md, Memory)")]
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    limit, used = int(memory.get("maxmemory", 0) or 0), int(memory.get("used_memory", 0) or 0)
    checks = []
    if policy.startswith(("allkeys-", "volatile-")):
        checks.append(Check("memory-policy", "warn", f"maxmemory-policy {policy} can evict "
                            "distbreaker keys (every key has a TTL, so volatile-* too): an "
                            "evicted OPEN breaker comes back CLOSED. Use noeviction, or a "
                            "Redis of its own (docs/OPERATIONS.md, Memory)"))
    else:
        checks.append(Check("memory-policy", "ok", f"maxmemory-policy {policy}: distbreaker "
                            "keys are never evicted"))
    if limit and used >= MEMORY_WARN_SHARE * limit:
        checks.append(Check("memory-use", "warn", f"used memory {used} of maxmemory {limit} "
                            f"bytes ({used * 100 // limit} %): writes fail when it is full "
                            "(protected calls then follow on_redis_error; OPEN still rejects)"))
    elif limit:
        checks.append(Check("memory-use", "ok", f"used memory {used * 100 // limit} % of "
                            "maxmemory"))
    return checks


def _refused(exc: BaseException) -> bool:
    """An ACL refusal of the command itself (the check is skipped, not failed)."""
    text = str(exc).lower()
    return isinstance(exc, NoPermissionError) or text.startswith("noperm") \
        or "no permissions to" in text


def _guarded(name: str, what: str, run: Callable[[], list[Check]]) -> list[Check]:
    """`run()`'s checks; a skip naming `what` when this user may not run it."""
    try:
        return run()
    except Exception as exc:
        if _refused(exc):
            return [Check(name, "skip", f"this user may not run {what} ({exc}): not checked")]
        raise


def role_check(client: Any) -> list[Check]:
    """A replica refuses every script that writes: workers then share nothing."""
    if view.is_cluster(client):
        return [Check("role", "ok", "cluster: scripts go to each slot's primary")]
    reply = client.execute_command("ROLE")
    role = view.text(reply[0]) if reply else "?"
    if role in ("slave", "replica"):
        return [Check("role", "fail", f"{READ_ONLY.what}; fix: {READ_ONLY.fix}")]
    if role == "sentinel":
        return [Check("role", "fail", "this is a Sentinel, not a Redis server; fix: use a "
                      "redis+sentinel:// URL naming the service")]
    return [Check("role", "ok", f"{role}: writable")]


def workers_check(client: Any, prefix: str, user: str) -> list[Check]:
    """What a component's `check()` does, for every script a worker runs."""
    key = BreakerKeys.build("doctor", prefix).state
    channel = events_channel(prefix, db_of(client))
    try:
        checked = preflight(client, "workers", [n for n in SCRIPT_NAMES if n != "ganesha"],
                            key, channel)
    except CheckFailed as failed:
        return [Check("workers", "fail", str(failed.detail).replace("<user>", user))]
    if not checked:
        return [Check("workers", "skip", "Redis < 7: the scripts' permissions are not "
                      "checkable without ACL DRYRUN")]
    return [Check("workers", "ok", "a worker's scripts may run here as this user: writable "
                  "primary, not full, every command they run inside Redis permitted")]


def _url_user(url: str) -> str:
    try:
        return str(parse_url(url).get("username") or "default")
    except (ValueError, TypeError):
        return "<user>"


def run_checks(app: App, user: str | None = None) -> list[Check]:
    """Every check, in order; `user`: whose permissions (another user than the URL's)."""
    client = app.client
    checks: list[Check] = []
    server = _info(client, "server") or _server_without_info(client)
    nodes = len(client.get_primaries()) if view.is_cluster(client) else 1
    version_text = str(server.get("redis_version", "0"))
    version = _version(version_text)
    mode = str(server.get("redis_mode", "standalone"))
    detail = f"Redis {version_text}, {mode}" + (
        f" ({nodes} primar{'y' if nodes == 1 else 'ies'})" if view.is_cluster(client) else "")
    if version < MIN_VERSION:
        checks.append(Check("server", "fail", f"{detail}: distbreaker needs Redis >= 5.0 "
                            "(streams, effect replication of scripts calling TIME)"))
    else:
        checks.append(Check("server", "ok", detail))

    checks.extend(_guarded("role", "ROLE", lambda: role_check(client)))
    checks.extend(_guarded("latency", "PING", lambda: latency_checks(client)))
    checks.extend(_guarded("scripts", "SCRIPT LOAD (workers do not need it: EVAL loads a "
                           "script the server lacks)", lambda: script_checks(client)))
    checks.append(function_check(client, version))
    checks.extend(workers_check(client, app.prefix, user or _url_user(app.url)))
    checks.extend(acl_checks(client, app.prefix, version, user))
    checks.extend(memory_checks(client))
    checks.extend(_guarded("clock", "TIME", lambda: clock_checks(client)))
    return checks


def latency_checks(client: Any) -> list[Check]:
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        client.ping()
        samples.append((time.perf_counter() - started) * 1000)
    median, worst = statistics.median(samples), max(samples)
    return [Check("latency", "warn" if median > LATENCY_WARN_MS else "ok",
                  f"round trip median {median:.2f} ms, max {worst:.2f} ms over 5 PINGs"
                  + (f" (above {LATENCY_WARN_MS:g} ms: raise redis_timeout)"
                     if median > LATENCY_WARN_MS else ""))]


def script_checks(client: Any) -> list[Check]:
    checks = []
    for path in sorted(lua_dir().glob("*.lua")):
        script = load_script(path.stem)
        try:
            sha = view.text(client.script_load(script.source))
        except Exception as exc:
            if _refused(exc):
                raise
            checks.append(Check(f"script {path.name}", "fail", f"SCRIPT LOAD failed: {exc}"))
            continue
        if sha != script.sha:
            checks.append(Check(f"script {path.name}", "fail",
                                f"server SHA1 {sha} != client SHA1 {script.sha}"))
        else:
            checks.append(Check(f"script {path.name}", "ok", f"loaded, sha1 {sha[:12]}"))
    return checks


def clock_checks(client: Any) -> list[Check]:
    skew = view.server_now_ms(client) - time.time() * 1000
    return [Check("clock", "ok", "state is timed by the Redis server clock only (TIME "
                  "inside every script); worker clocks need not agree. This host is "
                  f"{-skew:+.0f} ms from the server (informational)")]


@cli.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--user", "user", default=None, metavar="NAME",
              help="Check the ACL permissions of user NAME (ACL DRYRUN: connect as an admin) "
              "and print the ACL SETUSER line that grants what it lacks.")
@click.pass_obj
def doctor_command(app: App, as_json: bool, user: str | None) -> None:
    """Check Redis version and mode, role, latency, scripts, ACL permissions, memory."""
    checks = run_checks(app, user)
    failed = [c for c in checks if c.status == "fail"]
    if as_json:
        emit_json({"ok": not failed, "checks": [dataclasses.asdict(c) for c in checks]})
    else:
        marks = {"ok": click.style("ok  ", fg="green"), "warn": click.style("warn", fg="yellow"),
                 "skip": click.style("skip", fg="blue"), "fail": click.style("FAIL", fg="red")}
        for c in checks:
            click.echo(f"{marks[c.status]}  {c.name}: {c.detail}")
    for c in failed:
        click.echo(f"Error: {c.name}: {c.detail}", err=True)
    if failed:
        raise SystemExit(1)
