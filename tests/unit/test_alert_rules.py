"""docs/alerts.yml and docs/grafana-dashboard.json: valid for Prometheus (promtool check
and unit tests), and every metric they use is one the collector really exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from distbreaker import Bulkhead, CircuitBreaker, RetryBudget
from distbreaker.contrib.prometheus import DistbreakerCollector
from distbreaker.errors import CallNotPermitted

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "alerts.yml"
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
METRIC = re.compile(r"\bdistbreaker_[a-z_]+\b")


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: apt-get install prometheus (scripts/test does)"
    return found


def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 8 rules found" in done.stdout


def test_the_rules_fire_as_their_unit_tests_say() -> None:
    done = subprocess.run([promtool(), "test", "rules", "alerts_test.yml"],
                          cwd=ROOT / "tests" / "helpers", capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_cover_what_an_operator_must_hear_about() -> None:
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"]
             for r in g["rules"]}
    assert {"DistbreakerBreakerOpen", "DistbreakerBreakerFlapping", "DistbreakerHalfOpenStuck",
            "DistbreakerRetryBudgetExhausted", "DistbreakerBulkheadSaturated"} <= set(rules)
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("page", "warn", "info")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def exported_names(redis_url: str, name: str) -> set[str]:
    """Every metric name a real scrape exports, with a fleet that has all components."""
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=4,
                             minimum_number_of_calls=4, wait_duration_in_open_state=30)
    for _ in range(5):
        try:
            breaker.call(lambda: 1 / 0)
        except (ZeroDivisionError, CallNotPermitted):
            pass
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=2)
    with bulkhead:
        pass
    budget = RetryBudget(name, redis=redis_url)
    budget.deposit()
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, components=[breaker, bulkhead, budget]))
    text = generate_latest(registry).decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family, kind = line.split()[2:4]
            names.add(family)
            if kind == "counter":
                names.add(family.removesuffix("_total") + "_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line)[0])
    bulkhead.close()
    return names


def test_every_metric_in_the_rules_and_the_dashboard_is_exported(redis_url: str,
                                                                 name: str) -> None:
    exported = exported_names(redis_url, name)
    rules = yaml.safe_load(RULES.read_text())
    used_in_rules = {m for g in rules["groups"] for r in g["rules"]
                     for m in METRIC.findall(r["expr"])}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used_in_dashboard = {m for e in exprs for m in METRIC.findall(e)}
    assert used_in_rules and used_in_dashboard
    assert used_in_rules - exported == set()
    assert used_in_dashboard - exported == set()
    assert {"distbreaker_breaker_state_seconds",
            "distbreaker_breaker_transitions_total"} <= used_in_rules


@pytest.mark.parametrize("path", [RULES, DASHBOARD])
def test_the_files_name_no_machine_or_credential(path: Path) -> None:
    text = path.read_text()
    assert "/work/" not in text and "password" not in text.lower()
