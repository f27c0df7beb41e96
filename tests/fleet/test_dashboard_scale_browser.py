"""The fleet page updated by diffs, in headless Chromium against the real dashboard process
(the fixtures and helpers of tests/fleet/test_dashboard_browser.py): a changed row is
redrawn in place, every other row's node stays the same node (a text selection in it,
the selected row and the browser's find survive), only changed rows arrive; search,
filter and sort; rate limiter rows, reporting workers and time-window latency.
The numbers at 10,000 names: scripts/bench_dashboard.py."""

from __future__ import annotations

import time
from typing import Any

from selenium.webdriver.common.by import By

from distbreaker import CircuitBreaker, RateLimiter
from tests.fleet import test_dashboard_browser as base
from tests.fleet.test_dashboard_browser import DashboardProcess, wait_for

browser = base.browser  # the headless Chromium fixture (module-scoped here too)
NAMES = 120

ROW = "return document.querySelector('#rows .row[data-key=\"' + arguments[0] + '\"]')"
CELL = ("const row = document.querySelector('#rows .row[data-key=\"' + arguments[0] + '\"]');"
        "return row ? row.querySelector(arguments[1]).textContent : null")
SHOWN = ("return [...document.querySelectorAll('#rows .row[data-key]')]"
         ".filter(r => !r.hidden).map(r => r.dataset.key)")


def quiet(browser: Any) -> None:
    """Until the page got no update for 1.5 s (the first rates arrive once per row)."""
    last, since = -1, time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() - since < 1.5:
        updates = browser.execute_script("return page.stats.updates")
        if updates != last:
            last, since = updates, time.monotonic()
        assert time.monotonic() < deadline, "the page kept receiving updates"
        time.sleep(0.1)


def test_diffs_redraw_only_changed_rows_and_keep_selection_find_and_nodes(
        redis_url: str, browser: Any) -> None:
    breakers = [CircuitBreaker(f"tenant:{i:03d}", redis=redis_url, key_ttl=600)
                for i in range(NAMES)]
    for b in breakers:
        b.call(lambda: None)
    limiter = RateLimiter("partner-api", redis=redis_url, limit_for_period=100,
                          limit_refresh_period=1, key_ttl=600)
    limiter.acquire()
    timed = [CircuitBreaker("search", redis=redis_url, sliding_window_type="TIME_BASED",
                            sliding_window_size=30, key_ttl=600) for _ in range(2)]
    for b in timed:                                   # two worker instances report into it
        b.call(lambda: time.sleep(0.02))
    dashboard = DashboardProcess(redis_url)
    try:
        browser.get(dashboard.base + "/")
        wait_for(lambda: len(browser.execute_script(SHOWN)) == NAMES + 2, timeout=60)
        quiet(browser)
        # a text selection in one row, another row selected, node references kept
        browser.execute_script("""
            window.__kept = document.querySelector('#rows .row[data-key="tenant:050"]');
            window.__changed = document.querySelector('#rows .row[data-key="tenant:007"]');
            window.__cell = window.__kept.querySelector('.calls');
            window.__rows = page.stats.rows;""")
        browser.execute_script("arguments[0].querySelector('.probes').click()",
                               browser.execute_script(ROW, "tenant:100"))
        browser.execute_script("""
            const row = document.querySelector('#rows .row[data-key="tenant:050"]');
            const range = document.createRange();
            range.selectNodeContents(row.querySelector('.name a'));
            getSelection().removeAllRanges();
            getSelection().addRange(range);""")
        breakers[7].call(lambda: None)
        breakers[7].call(lambda: None)
        wait_for(lambda: browser.execute_script(CELL, "tenant:007", ".calls") == "3",
                 timeout=30)
        assert browser.execute_script(
            "return document.querySelector('#rows .row[data-key=\"tenant:007\"]')"
            " === window.__changed")                   # redrawn in place
        assert browser.execute_script(
            "return document.querySelector('#rows .row[data-key=\"tenant:050\"]') === window.__kept"
            " && window.__kept.querySelector('.calls') === window.__cell")
        assert browser.execute_script("return String(getSelection())") == "tenant:050"
        assert browser.execute_script(ROW, "tenant:100").get_attribute("aria-selected") == "true"
        received = browser.execute_script("return page.stats.rows - window.__rows")
        assert 1 <= received <= 6, received            # tenant:007's rows, not the fleet's
        assert browser.execute_script("return window.find('tenant:119')")  # find sees every row

        # rate limiter row, reporting workers, time-window latency
        wait_for(lambda: "permits/s" in (browser.execute_script(
            CELL, "partner-api", ".ratelimiter") or ""), timeout=30)
        assert "100 per 1s" in browser.execute_script(CELL, "partner-api", ".ratelimiter")
        assert browser.execute_script(CELL, "search", ".workers") == "2"
        latency = browser.execute_script(CELL, "search", ".latency")
        assert latency.startswith("~p50 ") and "~p99 " in latency, latency

        # search (a glob or a part of a name), filter by state, sort
        search = browser.find_element(By.ID, "search")
        search.send_keys("tenant:01*")
        wait_for(lambda: browser.execute_script(SHOWN) == [f"tenant:01{i}" for i in range(10)])
        search.clear()
        search.send_keys("API")
        wait_for(lambda: browser.execute_script(SHOWN) == ["partner-api"])
        search.clear()
        search.send_keys(" ")                          # an input event: the filter is cleared
        wait_for(lambda: len(browser.execute_script(SHOWN)) == NAMES + 2)
        breakers[42].transition_to_forced_open("drill", "ops")
        browser.execute_script("const f = document.getElementById('filter');"
                               "f.value = 'problems'; f.dispatchEvent(new Event('change'))")
        wait_for(lambda: browser.execute_script(SHOWN) == ["tenant:042"])
        browser.execute_script("const f = document.getElementById('filter');"
                               "f.value = ''; f.dispatchEvent(new Event('change'))")
        header = browser.find_element(By.CSS_SELECTOR, "#fleet .head [data-sort='name']")
        header.click()
        shown = browser.execute_script(SHOWN)
        assert shown == sorted(shown) and shown[0] == "partner-api"
        header.click()                                 # again: the other way round
        assert browser.execute_script(SHOWN) == sorted(shown, reverse=True)
        assert header.get_attribute("aria-sort") == "descending"
        assert browser.execute_script("return arguments[0] === window.__kept",
                                      browser.execute_script(ROW, "tenant:050"))
        # a breaker's page of an idle breaker: its rates from the snapshot (no update comes)
        browser.get(dashboard.base + "/breakers/tenant:050")
        wait_for(lambda: browser.execute_script(
            "const e = document.getElementById('fleet-rates');"
            "return e ? e.textContent : ''").startswith("0.00/s"), timeout=30)
    finally:
        dashboard.stop()
        for b in [*breakers, *timed]:
            b.close()
        limiter.close()


MEMBER = ("const row = document.querySelector('#pools [data-pool=\"' + arguments[0] + '\"] "
          "tr[data-member=\"' + arguments[1] + '\"]');"
          "return row ? [...row.children].map(c => c.textContent) : null")


def test_the_pool_view_shows_members_ejections_and_calls_in_flight(redis_url: str,
                                                                   browser: Any) -> None:
    from distbreaker import Pool

    pool = Pool("llm", redis=redis_url, members=["gpt-a", "gpt-b", "gpt-c"])
    for _ in range(4):
        with pool.use() as pick:
            pick.status = 200
    pool.eject("gpt-c", 120, actor="ops")
    held = pool.pick()                                  # one call in flight (not to gpt-c)
    dashboard = DashboardProcess(redis_url)
    try:
        browser.get(dashboard.base + "/")
        wait_for(lambda: browser.execute_script(MEMBER, "llm", "gpt-c") is not None, timeout=60)
        summary = browser.execute_script(
            "return document.querySelector('#pools [data-pool=\"llm\"] summary').textContent")
        assert "3 members, 1 ejected, 2 healthy" in summary
        member, state, why, until, *_ = browser.execute_script(MEMBER, "llm", "gpt-c")
        assert (member, why) == ("gpt-c", "operator") and state.startswith("ejected")
        assert until.endswith(" more") and until != "0s more", until   # for how long
        in_flight = [browser.execute_script(MEMBER, "llm", m)[4] for m in ("gpt-a", "gpt-b")]
        assert sorted(in_flight) == ["0", "1"]
        pool.record(held, status=200)                   # the call ends: a diff of the pool
        wait_for(lambda: [browser.execute_script(MEMBER, "llm", m)[4]
                          for m in ("gpt-a", "gpt-b")] == ["0", "0"], timeout=30)
        pool.uneject("gpt-c", actor="ops")
        wait_for(lambda: browser.execute_script(MEMBER, "llm", "gpt-c")[1] == "healthy",
                 timeout=30)
    finally:
        dashboard.stop()
        pool.reset()
        pool.close()
