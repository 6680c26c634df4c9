"""The shipped Prometheus rules (``deploy/prometheus/``) and ``/metrics`` under promtool.

``promtool`` is Debian's ``prometheus`` package (``.ci/run`` installs it); these tests
fail, not skip, without it, so CI can never pass them unrun.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from tests.dashboard.builders import build_fleet
from tests.factories import GIB
from zoekt import clock, jobmetrics
from zoekt.models import Move

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "zoekt-control.rules.yml"
RULE_TESTS = RULES_DIR / "zoekt-control.rules.test.yml"
INSTALL_PROMTOOL = "apt-get install prometheus"
#: The one lint ``promtool check metrics`` may report: GitLab's own name, kept
#: (docs/dashboard.md, "GitLab's names").
GITLAB_NAME_LINT = (
    'search_zoekt_repositories_states_total non-counter metrics should not have "_total" suffix'
)
#: Every metric name a rule can use: ours and GitLab's.
METRIC_NAME = re.compile(r"\b(?:search_zoekt|zoekt_control)_[a-z0-9_]+\b")
#: The sample names a family of each type exports besides (or instead of) its own name.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail(f"promtool is missing: install Debian's prometheus ({INSTALL_PROMTOOL})")
    return subprocess.run(
        ["promtool", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def scraped(db, client, now, prometheus_on_loopback) -> str:
    """A /metrics scrape with every family the rules read holding samples."""
    fleet = build_fleet(3, 3)
    common = {
        "trigger": "negative_unclaimed",
        "zoekt_enabled_namespace": fleet.namespaces[0],
        "namespace_id": fleet.namespaces[0].root_namespace_id,
        "source_node": fleet.nodes[0],
        "source_index_ref": fleet.indices[0].id,
        "bytes": GIB,
    }
    Move.objects.create(
        **common,
        state=Move.State.PARKED,
        reason="move_deadline_passed",
        created_at=clock.now() - timedelta(hours=2),
        parked_at=clock.now() - timedelta(hours=1),
    )
    Move.objects.create(
        **common,
        state=Move.State.DONE,
        created_at=clock.now() - timedelta(hours=2),
        done_at=clock.now() - timedelta(hours=1),
    )
    jobmetrics.reset()
    jobmetrics.record("zoekt.delete_lost_node", 0.5)
    response = client.get(reverse("metrics"))
    jobmetrics.reset()
    assert response.status_code == 200
    return response.content.decode()


def exported_names(text: str) -> set[str]:
    """Every series name the exposition can hold, by family: its samples' names, and the
    names its type implies (a counter with no sample yet still exports ``_total``)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return names


def names_in_rules() -> set[str]:
    return set(METRIC_NAME.findall(RULES.read_text()))


# --- the rules -------------------------------------------------------------------------------


def test_the_rules_pass_promtool_check_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def test_the_rules_pass_their_promtool_unit_tests():
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), flags=re.M))
    tests = RULE_TESTS.read_text()
    cases = re.findall(
        r"alertname: (\w+)\n\s+exp_alerts:( \[\])?", tests
    )  # (alert, " []" for a case where it must not fire)
    assert alerts and {name for name, quiet in cases if not quiet} == alerts
    assert {name for name, quiet in cases if quiet} == alerts


def test_every_alert_says_what_it_is_and_what_to_do():
    rules = RULES.read_text()
    for block in re.split(r"^\s+- alert: ", rules, flags=re.M)[1:]:
        name = block.split("\n", 1)[0]
        for annotation in ("summary:", "description:", "runbook:"):
            assert annotation in block, f"{name} has no {annotation}"


def test_every_metric_the_rules_read_is_one_metrics_exports(scraped):
    used = names_in_rules()
    assert {"zoekt_control_namespaces_dark", "search_zoekt_node_storage_percent_used"} <= used
    assert used - exported_names(scraped) == set()


def test_a_name_metrics_does_not_export_is_caught(scraped):
    assert "zoekt_control_namespaces_darkness" not in exported_names(scraped)


# --- /metrics under promtool check metrics ----------------------------------------------------


def test_promtool_finds_no_lint_in_a_scrape_but_gitlabs_own_name(scraped):
    result = promtool("check", "metrics", stdin=scraped)
    lints = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lints == [GITLAB_NAME_LINT]


def test_moves_without_a_reason_carry_no_empty_reason_label(scraped):
    moves = {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(scraped)
        if family.name == "zoekt_control_moves"
        for sample in family.samples
    }
    assert moves[(("state", "done"),)] == 1
    assert moves[(("reason", "move_deadline_passed"), ("state", "parked"))] == 1
    assert moves[(("state", "planned"),)] == 0
    assert not any(dict(labels).get("reason") == "" for labels in moves)
