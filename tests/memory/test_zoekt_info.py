"""``manage.py zoekt_info``: GitLab's ``gitlab:zoekt:info`` with memory beside disk (AC9)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from dashboard.management.commands import zoekt_info
from tests.factories import TaskFactory
from tests.memory.helpers import GIB, enabled_group, node, placed, set_setting
from zoekt.models import Index

pytestmark = pytest.mark.django_db

DISK = 100 * GIB


def run(*args: str) -> str:
    out = StringIO()
    call_command("zoekt_info", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def node_block(text: str, node_id: int) -> str:
    start = text.index(f"Node {node_id} - ")
    rest = text[start + 1 :]
    following = re.search(r"^Node \d+ - ", rest, re.M)
    return text[start : start + 1 + following.start()] if following else text[start:]


@pytest.fixture
def fleet(now):
    set_setting(zoekt_node_memory_budget_bytes=16 * GIB)
    hot = node(DISK, "zoekt-0", rss=12 * GIB, shards=40, limit=16 * GIB)
    placed(hot, 8 * GIB, 4 * GIB, used=20 * GIB)  # 12 GiB of repository: 6 GiB estimated
    cold = node(DISK, "zoekt-1", rss=GIB, shards=3)
    placed(cold, 2 * GIB, used=4 * GIB)
    quiet = node(DISK, "zoekt-2", process_health=None)
    node(DISK, "zoekt-3", last_seen_at=now - timedelta(minutes=10))
    enabled_group(GIB)
    TaskFactory(zoekt_node_id=hot.id)
    return hot, cold, quiet


def test_ac9_each_node_prints_its_estimated_memory_next_to_the_webserver_rss_line(fleet):
    hot, _cold, _quiet = fleet
    text = run()

    block = node_block(text, hot.id)
    (rss_line,) = [line for line in block.splitlines() if "Webserver RSS:" in line]
    assert "12.0 GiB" in rss_line
    assert "estimated for its indices: 6.0 GiB" in rss_line
    assert "observed 2.00× the estimate" in rss_line
    lines = block.splitlines()
    at = next(i for i, line in enumerate(lines) if "Webserver RSS:" in line)
    following = "\n".join(lines[at + 1 : at + 5])
    assert re.search(r"Estimated memory:\s+6\.0 GiB = repository 12\.0 GiB", following)
    assert re.search(r"Shards loaded:\s+40", following)
    assert re.search(
        r"Observed memory ratio:\s+0\.600 \(RSS / used storage of ready indices; not memory_ratio",
        following,
    )
    assert re.search(r"RSS per repository byte:\s+1\.000", following)


def test_the_memory_watermark_is_shown_beside_the_disk_watermark(fleet):
    hot, cold, _quiet = fleet
    text = run()
    lines = node_block(text, hot.id).splitlines()
    disk = next(i for i, line in enumerate(lines) if "Disk utilization:" in line)
    assert "Memory utilization:" in lines[disk + 1]
    assert "75.0% of 16.0 GiB (reported budget) - high; takes no new index" in lines[disk + 1]
    cold_lines = node_block(text, cold.id)
    assert "6.2% of 16.0 GiB (configured budget) - normal" in cold_lines


def test_a_node_without_process_health_prints_no_observation_and_no_error(fleet):
    _hot, _cold, quiet = fleet
    block = node_block(run(), quiet.id)
    assert re.search(r"Webserver RSS:\s+\(not reported\) \| estimated for its indices: 0 B", block)
    assert "no webserver RSS reported" in block
    assert re.search(r"Shards loaded:\s+\(not reported\)", block)


def test_the_sections_are_gitlabs_in_order(fleet):
    text = run()
    titles = [
        "Exact Code Search",
        "Nodes",
        "Indexing status",
        "Feature Flags (Non-Default Values)",
        "Feature Flags (Default Values)",
        "Node Details",
    ]
    positions = [text.index(f"{title}\n") for title in titles]
    assert positions == sorted(positions)
    assert "Feature Flags (Non-Default Values)\n  none\n" in text
    assert re.search(r"Version:\s+zoekt-control \d+\.\d+\.\d+", text)
    assert re.search(r"Node count:\s+4 - offline: 1, online: 3", text)
    assert re.search(r"Online node watermark levels:\s+3 - critical: 0, high: 0", text)
    assert re.search(
        r"Online node memory watermark levels:\s+3 - critical: 0, high: 1, low: 0, normal: 1, "
        r"unknown: 1",
        text,
    )
    assert re.search(r"Memory budget per node:\s+16\.0 GiB", text)
    assert re.search(r"Estimated resident memory per byte of repository:\s+0\.5", text)
    assert re.search(r"Memory concurrency factor \(constant\):\s+4 ", text)
    assert re.search(r"Enable indexing:\s+no", text)
    assert re.search(r"Indices count:\s+2 - ready: 2", text)
    assert re.search(
        r"EnabledNamespace count:\s+3 - rollout blocked: 0, with search disabled: 0, "
        r"without indices: 1",
        text,
    )
    assert re.search(r"Tasks count:\s+1 - pending: 1", text)
    assert re.search(r"Memory estimated / observed RSS:\s+7\.0 GiB / 13\.0 GiB over 2 online", text)


def test_without_the_budget_the_info_says_memory_planning_is_off(now):
    target = node(DISK, "zoekt-0", rss=GIB)
    text = run()
    assert re.search(r"Memory budget per node:\s+\(not set: memory planning off\)", text)
    assert "no memory budget" in node_block(text, target.id)


def test_a_reported_limit_is_shown_but_not_enforced_without_the_budget(now):
    target = node(DISK, "zoekt-0", rss=9 * GIB, limit=10 * GIB)
    block = node_block(run(), target.id)
    assert "90.0% of 10.0 GiB (reported budget) - critical" in block
    assert "not enforced" in block
    assert "takes no new index" not in block


def test_extended_is_the_default_without_watch_and_can_be_turned_off(fleet):
    assert "Node Details" in run()
    assert "Node Details" not in run("--no-extended")


def test_watch_reprints_until_interrupted_without_node_details_by_default(fleet, monkeypatch):
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(zoekt_info.time, "sleep", sleep)
    text = run("--watch", "5")
    assert sleeps == [5, 5]
    assert text.count(zoekt_info.CLEAR_SCREEN) == 2
    assert text.count("Every 5s: gitlab:zoekt:info at 2026-03-01 12:00:00 UTC") == 2
    assert "Node Details" not in text

    sleeps.clear()
    assert "Node Details" in run("--watch", "5", "--extended")


def test_json_carries_each_nodes_memory_for_the_dashboard(fleet):
    hot, _cold, _quiet = fleet
    data = json.loads(run("--json"))
    assert set(data) >= {"exact_code_search", "nodes", "indexing_status", "node_details"}
    (detail,) = [d for d in data["node_details"] if d["id"] == hot.id]
    assert detail["memory"]["rss_bytes"] == 12 * GIB
    assert detail["memory"]["estimated_memory_bytes"] == 6 * GIB
    assert detail["memory"]["observed_memory_ratio"] == 0.6
    assert detail["memory"]["memory_watermark"] == "high"
    assert detail["memory"]["shards_loaded"] == 40
    indices = data["indexing_status"]["indices"]
    assert indices["total"] == 2
    assert {state: n for state, n in indices["counts"].items() if n} == {"ready": 2}


def test_json_is_typed_bytes_seconds_times_and_counts(fleet):
    hot, _cold, _quiet = fleet
    data = json.loads(run("--json"))
    assert data["generated_at"] == "2026-03-01T12:00:00+00:00"
    nodes = data["nodes"]
    assert nodes["node_count"] == {"total": 4, "counts": {"offline": 1, "online": 3}}
    assert nodes["storage_total_bytes"] == 4 * DISK
    assert nodes["memory_observed_rss_bytes"] == 13 * GIB
    settings = data["exact_code_search"]["settings"]
    assert settings["eviction_sustain_seconds"] == 8 * 3600
    assert settings["node_memory_budget_bytes"] == 16 * GIB
    assert settings["search_enabled"] is False
    (detail,) = [d for d in data["node_details"] if d["id"] == hot.id]
    assert detail["online"] is True
    assert detail["last_seen_at"] == "2026-03-01T12:00:00+00:00"
    assert detail["unclaimed_storage_bytes"] == DISK
    assert data["gitlab"]["hook_lag_seconds"] == 0
    assert data["gitlab"]["last_sweep"] is None


def test_json_and_watch_do_not_mix(now):
    with pytest.raises(CommandError):
        run("--json", "--watch", "1")


def test_an_empty_installation_prints_every_section(now):
    text = run()
    assert re.search(r"Node count:\s+0 - offline: 0, online: 0", text)
    assert re.search(r"Last seen at:\s+\(never\)", text)
    assert "Node Details\n  none" in text
    assert Index.objects.count() == 0


# --- one way of writing each kind of figure -------------------------------------------------


def row_value(text: str, label: str) -> str:
    (line,) = [line for line in text.splitlines() if line.strip().startswith(f"{label}:")]
    return line.split(":", 1)[1].strip()


def test_the_memory_budget_is_labelled_without_a_unit_its_value_does_not_use(now):
    set_setting(zoekt_node_memory_budget_bytes=2 * GIB)
    text = run()
    assert row_value(text, "Memory budget per node") == "2.0 GiB"
    assert "(bytes)" not in text


def test_yes_and_no_are_written_alike_in_every_section(now):
    text = run()
    assert row_value(text, "Sweep configured") == "no"
    assert row_value(text, "System hook configured") == "no"
    assert row_value(text, "Enable indexing") == "no"
    assert "False" not in text and "True" not in text


def test_durations_are_written_in_one_form_in_every_section(now):
    set_setting(zoekt_eviction_sustain_period="8h", zoekt_indexing_timeout="90m")
    text = run()
    assert row_value(text, "Evict only after the node stayed over the high watermark for") == "8 h"
    assert row_value(text, "Sustain period") == "8 h"
    assert row_value(text, "Indexing timeout per project") == "1 h 30 min"
    assert row_value(text, "Default allowed delay of a node restart") == "30 min"
    assert row_value(text, "Hook lag") == "0 s"
    assert not re.search(r"\d[hms]\b", text)


def test_the_json_keeps_the_settings_as_typed_values(now):
    set_setting(zoekt_node_memory_budget_bytes=2 * GIB)
    report = json.loads(run("--json"))
    assert report["exact_code_search"]["settings"]["node_memory_budget_bytes"] == 2 * GIB
    assert report["exact_code_search"]["settings"]["eviction_sustain_seconds"] == 8 * 3600
    assert report["gitlab"]["sweep_configured"] is False


def test_nodes_are_listed_by_name(now):
    later = node(DISK, "zoekt-b")
    earlier = node(DISK, "zoekt-a")
    text = run()
    assert later.id < earlier.id
    assert text.index(f"Node {earlier.id} - zoekt-a") < text.index(f"Node {later.id} - zoekt-b")
    report = json.loads(run("--json"))
    assert [n["name"] for n in report["node_details"]] == ["zoekt-a", "zoekt-b"]


def test_nodes_over_the_high_watermark_are_listed_by_name(now):
    later = node(DISK, "zoekt-b", high_watermark_exceeded_at=now)
    earlier = node(DISK, "zoekt-a", high_watermark_exceeded_at=now)
    report = json.loads(run("--json"))
    assert later.id < earlier.id
    assert [n["name"] for n in report["eviction"]["nodes_over_high_watermark"]] == [
        "zoekt-a",
        "zoekt-b",
    ]
