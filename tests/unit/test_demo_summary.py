"""The demo's summary and plot preconditions (issue 16): each phase's trade-off in one
line, and --plot refused before the ~25 s run when matplotlib is missing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from distbreaker.demo.fleet import phase_tradeoff

ROOT = Path(__file__).resolve().parents[2]


def numbers(requests: int, ok: int, rejected: int, errors: int, upstream: int,
            p50: float) -> dict[str, object]:
    return {"requests": requests, "ok": ok, "rejected": rejected, "bulkhead": 0,
            "errors": errors, "upstream_calls": upstream, "latency_ms": {"p50": p50}}


def test_the_slow_phase_says_what_the_breaker_traded() -> None:
    line = phase_tradeoff("slow", numbers(216, 3, 213, 0, 3, 0.2),
                          numbers(20, 20, 0, 0, 30, 1002))
    assert "\n" not in line
    assert "WITH rejected 213 of 216" in line and "WITHOUT served 20 of 20, slowly" in line
    assert "p50 1002 ms" in line


def test_every_phase_has_one_line() -> None:
    for mode in ("ok", "failing", "slow", "recovering", "other"):
        line = phase_tradeoff(mode, numbers(10, 5, 5, 0, 5, 1), numbers(10, 8, 0, 2, 50, 700))
        assert line.startswith(mode) and "\n" not in line and len(line) < 200


def test_plot_without_matplotlib_fails_before_the_demo_runs(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        sys.modules["matplotlib"] = None  # as if it were not installed
        from distbreaker.cli import main
        sys.argv = ["distbreaker", "demo", "--plot", {str(tmp_path / "x.png")!r}]
        main()
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "--plot needs matplotlib: pip install matplotlib" in done.stderr
    assert "distbreaker demo:" not in done.stdout  # nothing was started


def test_plot_into_a_missing_folder_fails_before_the_demo_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "distbreaker.demo", "--plot",
                           str(tmp_path / "no" / "such" / "x.png")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "cannot write into" in done.stderr
    assert "distbreaker demo:" not in done.stdout
