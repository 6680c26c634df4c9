"""Admission control's figures per node on the fleet page, in /metrics and in zoekt_info:
slots in use, temporary bytes in flight, headroom, and the backlog by priority."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from dashboard.templatetags.zoekt_dashboard import bytes_filter as bytes_text
from tests.api.helpers import make_index_task
from tests.dashboard.test_metrics import by_node, scrape
from tests.factories import IndexFactory, NodeFactory
from zoekt.models import Index, Task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prometheus_on_loopback")]

GIB = 1024**3


@pytest.fixture
def busy_node(now):
    node = NodeFactory(metadata={"name": "zoekt-busy", "concurrency": 4})
    index = IndexFactory(zoekt_node=node, state=Index.State.INITIALIZING)
    for _ in range(2):
        make_index_task(index, repository_size=2 * GIB, state=Task.State.PROCESSING)
    for _ in range(2):
        make_index_task(index, repository_size=GIB)
    make_index_task(index, task_type=Task.TaskType.DELETE_REPO)
    return node


def test_metrics_give_each_nodes_slots_temporary_bytes_headroom_and_backlog(client, busy_node):
    metrics = scrape(client)
    node = busy_node

    assert by_node(metrics["zoekt_control_node_indexing_slots"])[node.id] == 4
    assert by_node(metrics["zoekt_control_node_indexing_in_flight"])[node.id] == 2
    assert by_node(metrics["zoekt_control_node_indexing_temporary_bytes"])[node.id] == 4 * GIB
    assert by_node(metrics["zoekt_control_node_indexing_headroom_bytes"])[node.id] == (
        int(0.70 * node.total_bytes) - node.used_bytes - 4 * GIB
    )
    backlog = {
        dict(labels)["priority"]: value
        for labels, value in metrics["zoekt_control_node_indexing_backlog"].items()
        if dict(labels)["zoekt_node_id"] == str(node.id)
    }
    assert backlog == {"delete": 1, "move": 0, "lost_data": 0, "never_indexed": 2, "update": 0}


def test_the_fleet_page_shows_the_slots_in_use_and_the_temporary_bytes(admin_client, busy_node):
    html = admin_client.get(reverse("dashboard-fleet")).content.decode()

    assert '<span class="slots">2 / 4</span>' in html
    assert '<span class="temporary">4.0\u00a0GiB</span>' in html
    assert "3 pending" in html
    # The headroom is to the build ceiling: the high watermark (75 %) less the band.
    headroom = int(0.70 * busy_node.total_bytes) - busy_node.used_bytes - 4 * GIB
    assert f'<span class="quiet headroom">{bytes_text(headroom)} to 70%</span>' in html


def test_zoekt_info_gives_the_backlog_by_priority_and_its_drain_time(busy_node, now):
    out = StringIO()
    call_command("zoekt_info", "--no-extended", stdout=out, stderr=StringIO())
    text = out.getvalue()

    assert "Indexing backlog by priority" in text
    assert "delete: 1" in text and "never_indexed: 2" in text
    # No task finished in the last 15 minutes: no pace to drain at.
    assert "unknown (no task finished in 15 min)" in text
    Task.objects.filter(state=Task.State.PROCESSING).update(state=Task.State.DONE)
    out = StringIO()
    call_command("zoekt_info", "--no-extended", "--json", stdout=out, stderr=StringIO())
    # Two finished in 15 minutes: the three pending take 22 min 30 s at that pace.
    assert '"indexing_backlog_drain_seconds": 1350' in out.getvalue()
