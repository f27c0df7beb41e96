"""`distbreaker replay` under hostile inputs (issue 27 review): every bad timeline line,
option or sweep is one clear error (exit 1 for the file, 2 for usage), never a traceback
or a hang (docs/guides/tuning.md, docs/guides/cli.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from distbreaker.cli import cli
from distbreaker.recording.replay_core import parse_sweep
from distbreaker.recording.timeline import TimelineError, read_jsonl

GOOD = '{"t_ms":1000,"ok":1}\n{"t_ms":2000,"failed":1}\n'


def replay(tmp_path: Path, content: bytes | str, *args: str) -> tuple[int, str]:
    path = tmp_path / "t.jsonl"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    done = CliRunner().invoke(cli, ["replay", str(path), *args])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.output
    return done.exit_code, done.output


@pytest.mark.parametrize(("content", "says"), [
    (b"\xff\xfe\x00bad\n", "not UTF-8"),
    ('{"t_ms":100000000000000000000,"ok":1}\n', "t_ms must be an integer in"),
    ('{"t_ms":1,"ok":100000000000000000000}\n', "ok must be an integer in"),
    ('{"t_ms":1,"ok":1,"rate":1e-300}\n', "rate must be in"),
    ('{"t_ms":1,"ok":1}\n{"t_ms":200000000000000,"failed":1}\n', "widen --truth-window"),
    ("", "no samples"), ('{"t_ms":1,"ok":1}\ngarbage\n', "line 2: not JSON"),
])
def test_a_bad_timeline_is_one_line_and_exit_1(tmp_path: Path, content: bytes | str,
                                               says: str) -> None:
    code, output = replay(tmp_path, content)
    assert code == 1 and says in output, output


@pytest.mark.parametrize("args", [
    ("--truth-window", "0"), ("--truth-window", "nan"), ("--truth-window", "inf"),
    ("--truth-min-calls", "-1"), ("--target-failure-rate", "-5"),
    ("--target-failure-rate", "nan"), ("--target-failure-rate", "101"),
    ("--sweep", "failure_rate_threshold=1..inf:1"),
    ("--sweep", "failure_rate_threshold=nan..inf:1"),
    ("--sweep", "failure_rate_threshold=1..1e308:1e-308"),
    ("--sweep", "failure_rate_threshold=70..30:10"), ("--sweep", "nofield=1,2"),
])
def test_bad_replay_options_are_usage_errors(tmp_path: Path, args: tuple[str, ...]) -> None:
    code, output = replay(tmp_path, GOOD, *args)
    assert code == 2 and "Error" in output, output


def test_the_limits_of_a_line_and_of_a_sweep() -> None:
    assert read_jsonl(['{"t_ms":253402300799999,"ok":1000000000,"rate":0.000001}'])
    with pytest.raises(TimelineError, match="line 1"):
        read_jsonl(['{"t_ms":1,"ok":1,"duration_ms":1000000000001}'])
    with pytest.raises(ValueError, match="finite"):
        parse_sweep("failure_rate_threshold=1..inf:1")
    assert parse_sweep("failure_rate_threshold=10..40:10")[1] == [10, 20, 30, 40]
