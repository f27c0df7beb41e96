"""Steady traffic for the docker-compose demo: web requests and Celery tasks.

``python docker/load.py``: $RATE requests per second to $WEB_URL and one
Celery task per $TASK_EVERY requests, forever (or $LOAD_SECONDS seconds).
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tasks import charge_task

WEB_URL = os.environ.get("WEB_URL", "http://localhost:8000")


def main() -> None:
    rate = float(os.environ.get("RATE", "20"))
    task_every = int(os.environ.get("TASK_EVERY", "4"))
    seconds = float(os.environ.get("LOAD_SECONDS", "0")) or float("inf")
    started = time.monotonic()
    counts: Counter[int] = Counter()
    sent = 0
    while time.monotonic() - started < seconds:
        try:
            with urllib.request.urlopen(WEB_URL + "/", timeout=5) as reply:
                counts[reply.status] += 1
        except urllib.error.HTTPError as error:
            counts[error.code] += 1
        except OSError:
            counts[0] += 1
        sent += 1
        if sent % task_every == 0:
            charge_task.delay(sent)
        if sent % int(rate * 5) == 0:
            print(f"web answers in the last 5s: {dict(counts)}", flush=True)
            counts.clear()
        time.sleep(1 / rate)


if __name__ == "__main__":
    main()
