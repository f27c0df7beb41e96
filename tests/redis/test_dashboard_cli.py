"""`distbreaker dashboard` as an operator runs it: `--port 0` announces the port it
really listens on, and Ctrl-C (SIGINT) stops it cleanly with exit code 0."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_port_0_announces_the_bound_port_and_ctrl_c_exits_0(redis_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "distbreaker", "--url", redis_url, "dashboard", "--port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        announced = re.search(r" on http://127\.0\.0\.1:(\d+)/$", line.strip())
        assert announced, line
        port = int(announced.group(1))
        assert port != 0

        def serving() -> bool:
            assert proc.poll() is None
            return httpx.get(f"http://127.0.0.1:{port}/api/config", timeout=5).status_code == 200

        wait_until(serving, timeout=60, interval=0.1, ignoring=(httpx.HTTPError,),
                   what="the dashboard serves on the announced port")
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Aborted" not in err and "Traceback" not in err, err
    assert "distbreaker dashboard stopped" in err
