"""Outcome recording under hostile inputs (issue 27 review): foreign data in the switch
or the stream is reported (exit 1, never a traceback) or skipped, never destroyed, and
bad options are usage errors (docs/guides/tuning.md, docs/guides/cli.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from distbreaker.cli import cli
from distbreaker.recording import control
from tests.helpers.cli import run


def test_a_foreign_switch_key_is_reported_and_kept(redis_url: str,
                                                   redis_client: redis.Redis) -> None:
    key = control.switch_key("rec-foreign")
    redis_client.set(key, "not ours", ex=600)
    for args in (("start", "rec-foreign"), ("stop", "rec-foreign"),
                 ("status", "rec-foreign")):
        done = run(redis_url, "record", *args)
        assert done.exit_code == 1 and "holds" in done.output, (args, done.output)
        assert "Traceback" not in done.output
    assert redis_client.get(key) == b"not ours"  # never overwritten
    redis_client.delete(key)
    redis_client.hset(key, mapping={"rate": "abc", "until": "xyz", "v": "a;b;c"})
    redis_client.expire(key, 600)
    done = run(redis_url, "record", "status", "rec-foreign")
    assert done.exit_code == 1 and "'rate'" in done.output, done.output


def test_export_skips_stream_entries_that_are_not_samples(redis_url: str,
                                                          redis_client: redis.Redis) -> None:
    key = control.stream_key("rec-mixed")
    redis_client.xadd(key, {"t": "abc", "ok": "x"})
    redis_client.xadd(key, {"foo": "bar"})
    redis_client.xadd(key, {"t": "5", "ok": "1", "r": "0"})
    redis_client.xadd(key, {"t": "1000", "ok": "0", "f": "1", "s": "0", "ms": "12", "w": "a:1",
                            "r": "100000", "st": "CLOSED"})
    redis_client.expire(key, 600)
    done = run(redis_url, "record", "export", "rec-mixed")
    assert done.exit_code == 0, done.output
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert lines == [{"name": "rec-mixed", "t_ms": 1000, "ok": 0, "failed": 1, "slow": 0,
                      "duration_ms": 12, "worker": "a:1", "rate": 0.1, "state": "CLOSED"}]
    assert "skipped 3 entries" in done.output


@pytest.mark.parametrize("args", [
    ("seed", "--rate", "0"), ("seed", "--seconds", "-5"), ("seed", "--failure-rate", "5"),
    ("seed", "--fail-from", "500", "--fail-until", "100"),
    ("seed", "--seconds", "604800", "--rate", "10000"),
    ("start", "x", "--ttl", "0.5s"), ("start", "x", "--max", "0"),
    ("start", "x", "--rate", "200%"),
])
def test_bad_record_options_are_usage_errors(args: tuple[str, ...]) -> None:
    done = run("redis://127.0.0.1:1/0", "record", *args)
    assert done.exit_code == 2 and "Traceback" not in done.output, done.output


def test_replay_labels_same_named_configs_apart_and_an_unwritable_plot_is_one_line(
        tmp_path: Path) -> None:
    timeline = tmp_path / "t.jsonl"
    timeline.write_text('{"t_ms":1000,"ok":1}\n{"t_ms":2000,"failed":1}\n', encoding="utf-8")
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "live.json").write_text('{"failure_rate_threshold": 50}',
                                                      encoding="utf-8")
    done = CliRunner().invoke(cli, ["replay", str(timeline),
                                    "--config", str(tmp_path / "a" / "live.json"),
                                    "--config", str(tmp_path / "b" / "live.json")])
    assert done.exit_code == 0 and "a/live.json" in done.output \
        and "b/live.json" in done.output, done.output
    done = CliRunner().invoke(cli, ["replay", str(timeline), "--plot",
                                    str(tmp_path / "missing" / "out.png")])
    assert done.exit_code == 1 and "Error" in done.output, done.output
    assert not isinstance(done.exception, OSError)
