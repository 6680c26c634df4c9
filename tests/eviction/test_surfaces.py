"""Where operators read eviction: the dashboard's Evictions page, the fleet page's sustain
clock and cooldown, ``/metrics`` and ``zoekt_info``, each from decisions eviction really made."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from eviction import actions as eviction
from eviction.models import EvictionDecision
from tests.dashboard.test_pages import cell, page_text, row_html
from tests.eviction.conftest import beat, ready_namespace
from tests.factories import (
    GIB,
    NodeFactory,
)
from zoekt import app_settings, clock
from zoekt.models import Index
from zoekt.reasons import Reason

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prometheus_on_loopback")]

HOUR = 3600


@pytest.fixture
def evicted(now):
    """Two runs of node-level eviction over three nodes.

    ``hot`` (86 %, over critical) is evicted from at once and starts its
    cooldown; ``waiting`` (78 %) waits out its sustain period twice (one row,
    two repeats); ``calm`` (40 %) has no clock. Ten minutes later ``hot`` is
    skipped because it is cooling down.
    """
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB, metadata={"name": "hot"})
    waiting = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB, metadata={"name": "waiting"})
    calm = NodeFactory(total_bytes=100 * GIB, used_bytes=40 * GIB, metadata={"name": "calm"})
    ready_namespace(hot, 30 * GIB)
    ready_namespace(hot, 50 * GIB)
    ready_namespace(waiting, 10 * GIB)
    waiting = beat(waiting, 78 * GIB)
    clock.advance(2 * HOUR)
    hot = beat(hot, 86 * GIB, seconds=0)
    waiting = beat(waiting, 78 * GIB, seconds=0)
    calm = beat(calm, 40 * GIB, seconds=0)
    first = eviction.run_node_level()
    assert first["decisions_applied"] == 1
    hot = beat(hot, 86 * GIB, seconds=600)
    waiting = beat(waiting, 78 * GIB, seconds=0)
    calm = beat(calm, 40 * GIB, seconds=0)
    eviction.run_node_level()
    applied = EvictionDecision.objects.get(applied_at__isnull=False)
    assert applied.reason == Reason.EVICTION_CRITICAL_WATERMARK
    repeated = EvictionDecision.objects.get(node=waiting)
    assert repeated.reason == Reason.EVICTION_SUSTAIN_NOT_REACHED
    assert repeated.repeats == 2
    cooling = EvictionDecision.objects.get(node=hot, applied_at__isnull=True)
    assert cooling.reason == Reason.EVICTION_NODE_COOLING_DOWN
    for node in (hot, waiting, calm):
        node.refresh_from_db()
    return {
        "hot": hot,
        "waiting": waiting,
        "calm": calm,
        "applied": applied,
        "repeated": repeated,
        "cooling": cooling,
    }


# --- the Evictions page ------------------------------------------------------------------------


def test_the_evictions_page_is_staff_only(client, now):
    response = client.get(reverse("dashboard-evictions"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_the_evictions_page_lists_nodes_over_high_with_their_clock_and_cooldown(
    admin_client, evicted
):
    response = admin_client.get(reverse("dashboard-evictions"))
    assert response.status_code == 200
    html = response.content.decode()
    over_high = re.search(r'<table class="dashboard" id="over-high">.*?</table>', html, re.S)[0]
    assert re.findall(r'data-node-name="([^"]+)"', over_high) == ["hot", "waiting"]
    hot_row = re.search(r'<tr data-node-id="\d+" data-node-name="hot".*?</tr>', over_high, re.S)[0]
    waiting_row = re.search(
        r'<tr data-node-id="\d+" data-node-name="waiting".*?</tr>', over_high, re.S
    )[0]
    assert cell(hot_row, "disk-percent") == "86.0%"
    assert cell(hot_row, "over-high") == "10 min"  # the clock started at the 86 % heartbeat
    assert cell(waiting_row, "over-high") == "2 h 10 min"
    assert cell(waiting_row, "sustain") == "5 h 50 min"
    until = evicted["hot"].eviction_cooldown_until
    assert until == evicted["applied"].applied_at + timedelta(hours=12)
    assert cell(hot_row, "cooldown") == until.strftime("%Y-%m-%d %H:%M UTC")
    assert cell(waiting_row, "cooldown") == "not cooling"

    cooling = re.search(r'<table class="dashboard" id="cooling">.*?</table>', html, re.S)[0]
    assert re.findall(r'data-node-name="([^"]+)"', cooling) == ["hot"]
    assert cell(cooling, "until") == until.strftime("%Y-%m-%d %H:%M UTC")
    assert cell(cooling, "left") == "11 h 50 min"
    text = page_text(response)
    assert "1 decisions applied" in text
    assert "1 nodes in cooldown" in text


def test_the_evictions_page_lists_every_decision_newest_first(admin_client, evicted):
    response = admin_client.get(reverse("dashboard-evictions"))
    html = response.content.decode()
    shown = [int(i) for i in re.findall(r'<tr data-decision-id="(\d+)"', html)]
    assert shown == [evicted["cooling"].id, evicted["repeated"].id, evicted["applied"].id]

    applied = evicted["applied"]
    row = row_html(response, "data-decision-id", applied.id)
    assert cell(row, "node") == "hot"
    assert cell(row, "trigger") == "node level"
    assert cell(row, "mode") == "safeguards"
    assert cell(row, "reason") == "eviction critical watermark"
    assert cell(row, "verdict") == "applied"
    assert cell(row, "namespaces") == "1"
    assert cell(row, "evicted") == "30.0 GiB"
    assert cell(row, "projected") == "86.0% → 56.0%"
    until = evicted["hot"].eviction_cooldown_until
    assert cell(row, "cooldown") == f"until {until:%Y-%m-%d %H:%M} UTC"

    repeated = row_html(response, "data-decision-id", evicted["repeated"].id)
    assert cell(repeated, "verdict") == "skipped"
    assert cell(repeated, "reason") == "eviction sustain not reached"
    assert cell(repeated, "repeats") == "2"
    assert cell(repeated, "seen") == f"{evicted['repeated'].last_seen_at:%Y-%m-%d %H:%M:%S} UTC"
    assert cell(repeated, "evicted") == "-"
    assert cell(repeated, "cooldown") == "-"


def test_an_ended_cooldown_shows_when_and_why(admin_client, evicted):
    Index.objects.filter(zoekt_node=evicted["hot"], state=Index.State.EVICTED).delete()
    Index.objects.filter(id__in=evicted["applied"].index_ids).delete()
    clock.advance(60)
    eviction.end_cooldowns()
    response = admin_client.get(reverse("dashboard-evictions"))
    row = row_html(response, "data-decision-id", evicted["applied"].id)
    assert (
        cell(row, "cooldown")
        == f"ended {clock.now():%Y-%m-%d %H:%M} UTC cooldown evicted indices gone"
    )
    assert "No node is cooling down." in page_text(response)


def test_the_evictions_page_pages_by_fifty(admin_client, now):
    node = NodeFactory()
    EvictionDecision.objects.bulk_create(
        EvictionDecision(
            node=node,
            node_name=node.name,
            trigger=EvictionDecision.Trigger.INDEX_WATERMARK,
            mode=EvictionDecision.Mode.SAFEGUARDS,
            reason=Reason.EVICTION_NOTHING_ELIGIBLE,
        )
        for _ in range(55)
    )
    url = reverse("dashboard-evictions")
    assert admin_client.get(url).content.decode().count("<tr data-decision-id=") == 50
    second = admin_client.get(url, {"page": 2})
    assert second.content.decode().count("<tr data-decision-id=") == 5
    assert "page 2 of 2 (55 in all)" in page_text(second)


def test_the_evictions_page_with_nothing_decided(admin_client, now):
    text = page_text(admin_client.get(reverse("dashboard-evictions")))
    assert "No node is over the high watermark." in text
    assert "No node is cooling down." in text
    assert "No eviction has been decided yet." in text


# --- the fleet page ----------------------------------------------------------------------------


def test_the_fleet_page_shows_each_nodes_sustain_clock_and_cooldown(admin_client, evicted):
    response = admin_client.get(reverse("dashboard-fleet"))
    until = evicted["hot"].eviction_cooldown_until
    hot = cell(row_html(response, "data-node-id", evicted["hot"].id), "eviction")
    assert hot == f"over high for 10 min cooling until {until:%H:%M} UTC"
    waiting = cell(row_html(response, "data-node-id", evicted["waiting"].id), "eviction")
    assert waiting == "over high for 2 h 10 min"
    assert cell(row_html(response, "data-node-id", evicted["calm"].id), "eviction") == "-"


# --- /metrics ----------------------------------------------------------------------------------


def scrape(client) -> dict[str, dict[tuple, float]]:
    response = client.get(reverse("metrics"))
    assert response.status_code == 200
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_count_evictions_by_trigger_and_mode_and_skips_by_reason(client, evicted):
    metrics = scrape(client)
    applied = {
        (dict(labels)["trigger"], dict(labels)["mode"]): value
        for labels, value in metrics["zoekt_control_evictions_total"].items()
    }
    assert applied[("node_level", "safeguards")] == 1
    assert len(applied) == 6  # every trigger and mode, zeros included
    assert sum(applied.values()) == 1
    affected = {
        (dict(labels)["trigger"], dict(labels)["mode"]): value
        for labels, value in metrics["zoekt_control_eviction_namespaces_affected_total"].items()
    }
    assert affected[("node_level", "safeguards")] == 1
    assert sum(affected.values()) == 1
    skipped = {
        (dict(labels)["trigger"], dict(labels)["reason"]): value
        for labels, value in metrics["zoekt_control_eviction_decisions_skipped_total"].items()
    }
    assert skipped == {
        ("node_level", "eviction_sustain_not_reached"): 2,
        ("node_level", "eviction_node_cooling_down"): 1,
    }


def test_metrics_show_nodes_in_cooldown_and_how_long_each_is_over_high(client, evicted):
    metrics = scrape(client)
    assert metrics["zoekt_control_nodes_in_eviction_cooldown"] == {(): 1}
    over = {
        dict(labels)["zoekt_node_name"]: value
        for labels, value in metrics["zoekt_control_node_over_high_watermark_seconds"].items()
    }
    assert over == {"hot": 600, "waiting": 2 * HOUR + 600}


def test_metrics_without_any_eviction(client, now):
    metrics = scrape(client)
    assert set(metrics["zoekt_control_evictions_total"].values()) == {0}
    assert metrics["zoekt_control_nodes_in_eviction_cooldown"] == {(): 0}
    assert "zoekt_control_node_over_high_watermark_seconds" not in metrics
    assert "zoekt_control_eviction_decisions_skipped_total" not in metrics


# --- zoekt_info --------------------------------------------------------------------------------


def info(*args: str) -> str:
    out = StringIO()
    call_command("zoekt_info", "--no-extended", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def section(text: str, title: str) -> str:
    start = text.index(f"{title}\n")
    end = text.find("\n\n", start)
    return text[start:end]


def test_zoekt_info_has_an_eviction_section(evicted):
    text = section(info(), "Eviction")
    assert re.search(r"Node-level eviction:\s+on", text)
    assert re.search(r"Safeguards:\s+on", text)
    assert re.search(r"Sustain period:\s+8 h\n", text)
    assert re.search(r"Cooldown:\s+12 h\n", text)
    assert re.search(r"Order:\s+smallest_used_first", text)
    until = f"{evicted['hot'].eviction_cooldown_until:%Y-%m-%d %H:%M:%S} UTC"
    assert re.search(
        rf"Nodes over high watermark:\s+2 - hot 86\.0% for 10 min, cooling until {until}; "
        r"waiting 78\.0% for 2 h 10 min\n",
        text,
    )
    assert re.search(rf"Nodes in cooldown:\s+1 - hot until {until} \(11 h 50 min left\)", text)
    assert re.search(r"Applied decisions:\s+1 - node_level/safeguards: 1", text)
    assert re.search(r"Namespaces affected:\s+1 - node_level/safeguards: 1", text)
    assert re.search(
        r"Skipped decisions:\s+3 - node_level/eviction_node_cooling_down: 1, "
        r"node_level/eviction_sustain_not_reached: 2",
        text,
    )
    recent = text[text.index("Recent decisions:") :].splitlines()[1:]
    assert [int(re.match(r"\s+#(\d+) ", line)[1]) for line in recent] == [
        evicted["cooling"].id,
        evicted["repeated"].id,
        evicted["applied"].id,
    ]
    assert (
        "applied: eviction_critical_watermark; 1 namespace(s), 30.0 GiB evicted, disk "
        in (recent[2])
    )
    assert "86.0% -> 56.0%" in recent[2]
    assert "(x2 since" in recent[1]


def test_zoekt_info_json_has_the_same_eviction_figures(evicted):
    report = json.loads(info("--json"))["eviction"]
    assert report["settings"]["node_eviction_safeguards"] is True
    assert report["settings"]["eviction_sustain_seconds"] == 8 * HOUR
    assert [n["name"] for n in report["nodes_over_high_watermark"]] == ["hot", "waiting"]
    assert report["nodes_over_high_watermark"][1]["over_high_seconds"] == 2 * HOUR + 600
    assert [n["name"] for n in report["nodes_in_cooldown"]] == ["hot"]
    assert report["nodes_in_cooldown"][0]["cooldown_seconds_left"] == 11 * HOUR + 50 * 60
    assert report["applied"] == {"node_level/safeguards": 1}
    assert report["namespaces_affected"] == {"node_level/safeguards": 1}
    assert report["skipped"] == {
        "node_level/eviction_node_cooling_down": 1,
        "node_level/eviction_sustain_not_reached": 2,
    }
    assert [d["id"] for d in report["recent"]] == [
        evicted["cooling"].id,
        evicted["repeated"].id,
        evicted["applied"].id,
    ]
    applied = report["recent"][2]
    assert applied["applied"] is True
    assert applied["evicted_bytes"] == 30 * GIB
    assert applied["projected_used_bytes"] == 56 * GIB


def test_zoekt_info_with_nothing_to_evict_says_so(now):
    app_settings.update(zoekt_node_eviction_safeguards=False)
    text = section(info(), "Eviction")
    assert re.search(r"Safeguards:\s+off \(GitLab's legacy behaviour\)", text)
    assert re.search(r"Nodes over high watermark:\s+0\n", text)
    assert re.search(r"Nodes in cooldown:\s+0\n", text)
    assert "Recent decisions: (none)" in text


# --- statement counts --------------------------------------------------------------------------


def statements(client, url: str) -> int:
    client.get(url)  # warm: settings cache, session
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


def test_statements_do_not_grow_with_the_decisions_shown(admin_client, evicted):
    urls = [reverse("dashboard-evictions"), reverse("metrics"), reverse("dashboard-fleet")]
    few = [statements(admin_client, url) for url in urls]
    for i in range(40):
        node = NodeFactory(
            total_bytes=100 * GIB,
            used_bytes=80 * GIB,
            high_watermark_exceeded_at=clock.now() - timedelta(hours=i),
            eviction_cooldown_until=clock.now() + timedelta(hours=1),
            metadata={"name": f"more-{i}"},
        )
        EvictionDecision.objects.create(
            node=node,
            node_name=node.name,
            trigger=EvictionDecision.Trigger.NODE_LEVEL,
            mode=EvictionDecision.Mode.SAFEGUARDS,
            reason=Reason.EVICTION_SUSTAINED_OVER_HIGH_WATERMARK,
            applied_at=clock.now(),
            namespaces_affected=2,
            chosen=[{"index_id": i, "used_storage_bytes": GIB}],
        )
    many = [statements(admin_client, url) for url in urls]
    assert "more-39" in admin_client.get(urls[0]).content.decode()
    assert many == few
    assert few[0] == 3 + 5  # session and user, then the page's five
