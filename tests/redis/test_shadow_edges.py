"""Shadow configs under hostile inputs (issue 27 review): a slot no script wrote is
skipped by every reader, bad candidates and names are usage errors naming the file or
option, never a traceback (docs/guides/shadow.md, docs/guides/cli.md)."""

from __future__ import annotations

from pathlib import Path

import redis

from distbreaker._runtime.keys import BreakerKeys
from distbreaker.breaker.shadow import shadow_key
from tests.helpers.cli import make, run


def test_a_foreign_slot_is_skipped_by_shadow_and_show(redis_url: str,
                                                      redis_client: redis.Redis,
                                                      name: str) -> None:
    make(name, redis_url).call(lambda: None)
    key = shadow_key(BreakerKeys.build(name).state)
    redis_client.hset(key, mapping={"c1": "garbage", "h1": "zz", "s1": "yy"})
    redis_client.expire(key, 600)
    for args in (("shadow", name), ("show", name), ("shadow", name, "--json")):
        done = run(redis_url, *args)
        assert done.exit_code == 0 and "Traceback" not in done.output, (args, done.output)
    assert "no shadow configs" in run(redis_url, "shadow", name).output
    assert make(name, redis_url).call(lambda: "ok") == "ok"  # the hot path never minds


def test_bad_candidates_and_names_are_usage_errors(redis_url: str, tmp_path: Path,
                                                   name: str) -> None:
    make(name, redis_url).call(lambda: None)
    files = {"range.yaml": b"failure_rate_threshold: 300\n",
             "nan.yaml": b"failure_rate_threshold: .nan\n",
             "binary.yaml": b"\xff\xfe", "unknown.yaml": b"nonsense: 3\n"}
    for file, content in files.items():
        path = tmp_path / file
        path.write_bytes(content)
        done = run(redis_url, "shadow", name, "--config", str(path))
        assert done.exit_code == 2 and file in done.output, done.output
        assert "candidate'" not in done.output  # no placeholder name in the message
    done = run(redis_url, "shadow", name, "--off", "--as", "bad name")
    assert done.exit_code == 2 and "--as" in done.output, done.output


def test_a_shadow_carries_a_bounded_reason(redis_url: str, tmp_path: Path, name: str) -> None:
    make(name, redis_url).call(lambda: None)
    path = tmp_path / "tight.yaml"
    path.write_text("failure_rate_threshold: 30\n", encoding="utf-8")
    done = run(redis_url, "shadow", name, "--config", str(path), "--reason", "r" * 201)
    assert done.exit_code == 2 and "--reason" in done.output, done.output
    assert "no shadow configs" in run(redis_url, "shadow", name).output


def test_a_mistyped_name_is_unknown_not_shadowless(redis_url: str, name: str) -> None:
    make(name, redis_url).call(lambda: None)
    for args in (("shadow", name + "x"), ("shadow", name + "x", "--json"),
                 ("shadow", name + "x", "--off"), ("events", "--shadow", name + "x")):
        done = run(redis_url, *args)
        assert done.exit_code == 1 and "unknown breaker" in done.output, (args, done.output)
        assert "did you mean" in done.output
    assert run(redis_url, "shadow", name).exit_code == 0  # a breaker without shadows
