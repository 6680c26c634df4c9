"""The node admin shows memory beside disk: budget, observed RSS, memory %, memory watermark."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.memory.helpers import GIB, node, placed, set_setting
from tests.zoekt.test_admin import node_list, row_of, url
from zoekt import app_settings
from zoekt.admin import human_bytes
from zoekt.models import Node

pytestmark = pytest.mark.django_db


def test_the_node_changelist_shows_memory_beside_disk(admin_client, now):
    set_setting(zoekt_node_memory_budget_bytes=16 * GIB)
    node(100 * GIB, "zoekt-hot", rss=12 * GIB, limit=16 * GIB)
    node(100 * GIB, "zoekt-cool", rss=2 * GIB, version=None)
    node(100 * GIB, "zoekt-quiet", process_health=None)

    response = node_list(admin_client)

    columns = list(response.context["cl"].list_display)
    assert columns.index("memory_percent_used") == columns.index("disk_watermark") + 1
    hot = row_of(response, "zoekt-hot")
    assert "75.0%" in hot and ">high<" in hot
    assert human_bytes(12 * GIB) in hot
    assert "(reported)" in hot
    cool = row_of(response, "zoekt-cool")
    assert "12.5%" in cool and ">normal<" in cool and "(configured)" in cool
    quiet = row_of(response, "zoekt-quiet")
    assert ">normal<" in quiet  # the disk watermark; no memory signal, shown as "-"


def test_the_node_page_explains_an_unused_reported_limit(admin_client, now):
    old = node(100 * GIB, "zoekt-old", rss=GIB, limit=8 * GIB, version="v1.15.0")
    html = admin_client.get(url(Node, "change", old.pk)).content.decode()
    assert "not used: needs Zoekt 1.16.0 or later" in html
    assert "Shards loaded" in html and "Memory watermark" in html


def test_memory_columns_keep_the_node_changelist_query_count_constant(admin_client, now):
    set_setting(zoekt_node_memory_budget_bytes=16 * GIB)

    def measure() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert node_list(admin_client).status_code == 200
        return len(queries)

    for i in range(3):
        placed(node(100 * GIB, f"a{i}", rss=i * GIB, limit=8 * GIB), GIB)
    app_settings.current()  # the settings are cached (Redis), as in a running server
    with_3 = measure()
    for i in range(27):
        placed(node(100 * GIB, f"b{i}", rss=i * GIB), GIB)
    assert measure() == with_3
