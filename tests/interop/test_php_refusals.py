"""The PHP client treats a refusal or a wrong target as an outage too (issue 23): under
fail_open its breaker, bulkhead and budget run the call (or answer) instead of raising
SchemaError (a port speaking the Redis protocol that is not Redis) or
DistbreakerException (an ACL refusal inside a script), and log the cause once."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from distbreaker.demo.embedded import RedisServer
from tests.helpers.fake_servers import HTTP_REPLY, CannedServer

AUTOLOAD = Path(__file__).resolve().parents[2] / "clients" / "php" / "src" / "autoload.php"

#: Each component once through a raw phpredis client and once through a Connection.
SCRIPT = """<?php
require $argv[1];
use Distbreaker\\{CircuitBreaker, Bulkhead, RetryBudget, Connection};
[$host, $port, $url] = [$argv[2], (int) $argv[3], $argv[4]];
foreach (['raw', 'connection'] as $how) {
    foreach (['cb', 'bh', 'rb'] as $kind) {
        if ($how === 'raw') {
            $redis = new Redis();
            $redis->connect($host, $port, 5.0);
            if (($argv[5] ?? '') !== '') { $redis->auth([$argv[5], 'pw']); }
        } else {
            $redis = Connection::fromConfig(['url' => $url]);
        }
        try {
            $out = match ($kind) {
                'cb' => (new CircuitBreaker($redis, "x-$how"))->call(fn () => 'ran'),
                'bh' => (new Bulkhead($redis, "x-$how", ['max_concurrent_calls' => 2]))
                    ->call(fn () => 'ran'),
                'rb' => var_export((new RetryBudget($redis, "x-$how"))->tryWithdraw(), true),
            };
            echo "$how $kind $out\\n";
        } catch (\\Throwable $e) {
            echo "$how $kind ESCAPED " . get_class($e) . ': ' . $e->getMessage() . "\\n";
        }
    }
}
"""


@pytest.fixture
def server() -> Iterator[RedisServer]:
    started = RedisServer().start()
    yield started
    started.stop()


def run_php(php: str, tmp_path: Path, host: str, port: int, url: str,
            user: str = "") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "refusals.php"
    script.write_text(SCRIPT)
    return subprocess.run([php, str(script), str(AUTOLOAD), host, str(port), url, user],
                          capture_output=True, text=True, timeout=120)


def assert_fails_open(done: subprocess.CompletedProcess[str]) -> None:
    lines = done.stdout.splitlines()
    assert len(lines) == 6, done.stdout + done.stderr
    for line in lines:
        _, kind, out = line.split(" ", 2)
        assert out == ("false" if kind == "rb" else "ran"), line


def test_a_resp_mock_is_an_outage_not_schema_error(php: str, tmp_path: Path) -> None:
    with CannedServer(b"+OK\r\n") as mock:
        done = run_php(php, tmp_path, "127.0.0.1", mock.port, mock.url)
    assert_fails_open(done)
    logged = [line for line in done.stderr.splitlines() if "refuses to serve" in line]
    assert len(logged) == 1 and "not a Redis server" in logged[0], done.stderr


def test_an_http_port_is_an_outage(php: str, tmp_path: Path) -> None:
    with CannedServer(HTTP_REPLY, close_after=True) as http:
        assert_fails_open(run_php(php, tmp_path, "127.0.0.1", http.port, http.url))


def test_an_acl_refusal_inside_a_script_is_an_outage(php: str, tmp_path: Path,
                                                      server: RedisServer) -> None:
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "notime", "on", ">pw", "~*", "&*", "+@all",
                          "-time")
    url = f"redis://notime:pw@127.0.0.1:{server.port}/0"
    done = run_php(php, tmp_path, "127.0.0.1", server.port, url, "notime")
    assert_fails_open(done)
    logged = [line for line in done.stderr.splitlines() if "refuses to serve" in line]
    assert len(logged) == 1 and "can't run this command" in logged[0], done.stderr
    admin.close()


def test_a_database_out_of_range_is_an_outage(php: str, tmp_path: Path,
                                              server: RedisServer) -> None:
    done = run_php(php, tmp_path, "127.0.0.1", server.port,
                   f"redis://127.0.0.1:{server.port}/99")
    lines = [line for line in done.stdout.splitlines() if line.startswith("connection ")]
    assert lines and all(line.split(" ", 2)[2] in ("ran", "false") for line in lines), \
        done.stdout + done.stderr
