"""The chaos run shared by every test in tests/chaos/: the session fixture `chaos`.

It runs the harness of tests/helpers/chaos.py once (a private `redis-server`, the
fleet, every fault of the schedule) and writes the report (chaos.json + CHAOS.md)
to $DISTBREAKER_CHAOS_REPORT (a directory; e.g. ``reports``) or a temporary one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from distbreaker.demo.embedded import RedisServer
from tests.helpers.chaos import ChaosResult, ChaosRun, Figures, analyse, clean_buckets, write_report


@pytest.fixture(scope="session")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosResult]:
    server = RedisServer().start()
    run = ChaosRun(server)
    try:
        run.start_fleet()
        run.run_schedule()
        run.stop_fleet()
    except BaseException:
        server.stop()
        raise
    finally:
        run.kill_all()
    figures = Figures.merge(run.reports)
    report = analyse(run, figures)
    target = os.environ.get("DISTBREAKER_CHAOS_REPORT")
    directory = Path(target) if target else tmp_path_factory.mktemp("chaos-report")
    write_report(report, directory)
    yield ChaosResult(run, figures, report, directory, clean_buckets(run, figures))
    run.admin.close()
    server.stop()
