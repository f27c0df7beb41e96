"""`distbreaker doctor` for ACL and memory (issue 13): the exact ACL SETUSER line for a
user lacking channel permission, a user without INFO, an evicting maxmemory-policy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from distbreaker.cli import cli
from distbreaker.demo.embedded import RedisServer


def doctor(url: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--url", url, "doctor"])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def server() -> Iterator[RedisServer]:
    started = RedisServer().start()
    yield started
    started.stop()


def test_a_user_without_channel_permission_gets_the_line_that_fixes_it(
        server: RedisServer) -> None:
    admin = redis.Redis(port=server.port)
    # Redis 7's default for a new user: no channel (acl-pubsub-default resetchannels)
    admin.execute_command("ACL", "SETUSER", "worker", "on", ">pw", "~distbreaker:*",
                          "resetchannels", "+@all")
    code, out, err = doctor(f"redis://worker:pw@127.0.0.1:{server.port}/0")
    assert code == 1
    assert "ACL SETUSER worker &distbreaker:v2:events" in out
    assert "PUBLISH (needed by lua/breaker.lua" in err
    # applying the printed rule fixes it
    admin.execute_command("ACL", "SETUSER", "worker", "&distbreaker:v2:events")
    code, out, _ = doctor(f"redis://worker:pw@127.0.0.1:{server.port}/0")
    assert code == 0, out
    assert "acl-fix" not in out


def test_a_user_without_info_is_still_checked(server: RedisServer) -> None:
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw", "~distbreaker:*",
                          "&distbreaker:v2:events", "+@all", "-info")
    code, out, _ = doctor(f"redis://noinfo:pw@127.0.0.1:{server.port}/0")
    assert "server: Redis 7" in out
    assert "skip  memory: INFO memory not permitted" in out
    assert "INFO (needed by operator" in out          # only the operator tools need it
    assert code == 0, out


def test_an_evicting_policy_and_a_nearly_full_redis_are_warned(server: RedisServer) -> None:
    admin = redis.Redis(port=server.port)
    admin.config_set("maxmemory-policy", "volatile-lru")
    admin.config_set("maxmemory", str(int(admin.info("memory")["used_memory"] * 1.1)))
    _, out, _ = doctor(server.url)
    assert "warn  memory-policy: maxmemory-policy volatile-lru can evict" in out
    assert "warn  memory-use: used memory" in out
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "0")
    _, out, _ = doctor(server.url)
    assert "ok    memory-policy: maxmemory-policy noeviction" in out
