"""The operator's admin: every model lists and opens, node columns, filters, settings."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django import forms
from django.apps import apps
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.factories import (
    GIB,
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NamespaceRootStorageStatisticsFactory,
    NodeFactory,
    ProjectFactory,
    RepositoryFactory,
    TaskFactory,
)
from zoekt import app_settings
from zoekt.admin import human_bytes
from zoekt.models import (
    ApplicationSetting,
    AuditEvent,
    EnabledNamespace,
    ForkNetworkMember,
    HandledTaskFailure,
    Index,
    Move,
    Node,
    NodeShutdown,
    ProjectFeature,
    Replica,
    Task,
)

pytestmark = pytest.mark.django_db

ZOEKT_MODELS = sorted(apps.get_app_config("zoekt").get_models(), key=lambda m: m.__name__)
LISTED_MODELS = [model for model in ZOEKT_MODELS if model is not ApplicationSetting]


def url(model, view: str, *args) -> str:
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)


def node_list(client, **params):
    return client.get(url(Node, "changelist"), params)


def listed_ids(response) -> set[int]:
    return {obj.pk for obj in response.context["cl"].result_list}


def row_of(response, text: str) -> str:
    """The changelist table row whose HTML contains ``text``."""
    rows = re.findall(r"<tr[^>]*>.*?</tr>", response.content.decode(), flags=re.S)
    matching = [row for row in rows if text in row]
    assert len(matching) == 1, f"{len(matching)} rows contain {text!r}"
    return matching[0]


def form_data(response, **overrides) -> dict[str, str]:
    """POST data that resubmits the change form on ``response`` as shown, plus overrides."""
    form = response.context["adminform"].form
    data: dict[str, str] = {}
    for name, field in form.fields.items():
        value = form.initial.get(name)
        if isinstance(field, forms.BooleanField):
            if value:
                data[name] = "on"
        elif isinstance(field, forms.SplitDateTimeField):
            data[f"{name}_0"] = value.date().isoformat() if value else ""
            data[f"{name}_1"] = value.time().isoformat() if value else ""
        else:
            data[name] = "" if value is None else str(value)
    for name, value in overrides.items():
        if value is False:
            data.pop(name, None)
        else:
            data[name] = "on" if value is True else str(value)
    return data


@pytest.fixture
def fleet(now):
    """At least one row of every model."""
    node = NodeFactory(metadata={"name": "zoekt-fleet", "version": "v1.2.3"})
    repo = RepositoryFactory(
        zoekt_index__zoekt_node=node, project=ProjectFactory(repository_size=GIB)
    )
    TaskFactory(
        zoekt_node_id=node.id,
        zoekt_repository_id=repo.id,
        project_identifier=repo.project_identifier,
    )
    NamespaceRootStorageStatisticsFactory(namespace=repo.project.namespace)
    ProjectFeature.objects.create(project=repo.project)
    ForkNetworkMember.objects.create(project=repo.project, forked_from_project=ProjectFactory())
    Move.objects.create(
        trigger="node_level",
        zoekt_enabled_namespace=repo.zoekt_index.zoekt_enabled_namespace,
        namespace_id=repo.zoekt_index.namespace_id,
        source_node=node,
        source_index=repo.zoekt_index,
        source_index_ref=repo.zoekt_index_id,
        bytes=GIB,
    )
    HandledTaskFailure.objects.create(task_id=1)
    NodeShutdown.objects.create(
        node=node,
        node_ref=node.id,
        node_name=node.name,
        type="restart",
        reason="upgrade",
        requested_by="ops",
        allowed_delay_seconds=1800,
    )
    app_settings.load_row()
    AuditEvent.objects.create(
        author_name="ops", via="admin", event_name="node_deleted", outcome="ok"
    )
    return repo


def test_every_zoekt_model_is_registered():
    assert set(ZOEKT_MODELS) <= set(admin.site._registry)
    assert len(ZOEKT_MODELS) == 17


def test_site_titles(admin_client):
    response = admin_client.get(reverse("admin:index"))
    assert response.status_code == 200
    assert admin.site.site_header == "zoekt-control"
    assert "zoekt-control" in response.content.decode()


@pytest.mark.parametrize("model", LISTED_MODELS, ids=lambda m: m.__name__)
def test_changelist_lists_rows(admin_client, fleet, model):
    response = admin_client.get(url(model, "changelist"))
    assert response.status_code == 200
    listed = response.context["cl"].result_list
    assert len(listed) >= 1
    assert set(listed) <= set(model.objects.all())


@pytest.mark.parametrize("model", ZOEKT_MODELS, ids=lambda m: m.__name__)
def test_change_page_renders(admin_client, fleet, model):
    obj = model.objects.order_by("pk").first()
    response = admin_client.get(url(model, "change", obj.pk))
    assert response.status_code == 200


@pytest.mark.parametrize("model", LISTED_MODELS, ids=lambda m: m.__name__)
def test_changelist_search_tolerates_any_text(admin_client, fleet, model):
    response = admin_client.get(url(model, "changelist"), {"q": "not-a-number"})
    assert response.status_code == 200


def test_node_columns_sort(admin_client, fleet):
    columns = len(admin.site._registry[Node].list_display)
    for position in range(1, columns + 1):
        for order in (str(position), f"-{position}"):
            assert node_list(admin_client, o=order).status_code == 200, order


# --- nodes --------------------------------------------------------------------------


def test_node_changelist_shows_computed_columns(admin_client, now):
    fresh = NodeFactory(
        metadata={"name": "zoekt-fresh", "version": "v9"},
        last_seen_at=now - timedelta(seconds=10),
        total_bytes=100 * GIB,
        used_bytes=80 * GIB,
        schema_version=2,
    )
    stale = NodeFactory(
        metadata={"name": "zoekt-stale"},
        last_seen_at=now - timedelta(seconds=60),
        total_bytes=100 * GIB,
        used_bytes=10 * GIB,
    )
    # usable 90 GiB, one index reserving 100 GiB: 10 GiB over-committed.
    IndexFactory(zoekt_node=stale, reserved_storage_bytes=100 * GIB)
    IndexFactory(zoekt_node=stale, reserved_storage_bytes=0)

    response = node_list(admin_client)
    assert response.status_code == 200

    fresh_row = row_of(response, "zoekt-fresh")
    assert str(fresh.uuid) in fresh_row
    assert "80.0%" in fresh_row
    assert ">high<" in fresh_row
    assert 'alt="True"' in fresh_row
    assert human_bytes(20 * GIB) in fresh_row  # usable 20 GiB, nothing reserved
    assert "v9" in fresh_row

    stale_row = row_of(response, "zoekt-stale")
    assert "10.0%" in stale_row
    assert ">normal<" in stale_row
    assert 'alt="False"' in stale_row
    assert human_bytes(-10 * GIB) == "-10.0\xa0GiB"
    assert human_bytes(-10 * GIB) in stale_row
    assert f'title="{-10 * GIB} bytes"' in stale_row
    index_link = f"{url(Index, 'changelist')}?zoekt_node__id__exact={stale.pk}"
    assert f'<a href="{index_link}">2</a>' in stale_row


def test_node_change_page_shows_capacity(admin_client, now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=90 * GIB, indexed_bytes=0)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=15 * GIB)

    html = admin_client.get(url(Node, "change", node.pk)).content.decode()

    assert "90.0%" in html
    assert ">critical<" in html
    assert human_bytes(15 * GIB) in html  # reserved
    assert human_bytes(-5 * GIB) in html  # unclaimed: 10 GiB usable - 15 GiB reserved
    assert "zoekt" in re.search(r"field-services_display.*?</div>\s*</div>", html, re.S).group()


def test_node_changelist_query_count_does_not_grow_with_nodes(admin_client, now):
    def measure() -> int:
        with CaptureQueriesContext(connection) as queries:
            response = node_list(admin_client)
        assert response.status_code == 200
        return len(queries)

    for _ in range(3):
        IndexFactory(zoekt_node=NodeFactory())
    assert len(node_list(admin_client).context["cl"].result_list) == 3
    with_3 = measure()

    for _ in range(27):
        IndexFactory(zoekt_node=NodeFactory())
    assert len(node_list(admin_client).context["cl"].result_list) == 30
    with_30 = measure()

    assert with_30 == with_3
    assert with_3 <= 10


def test_online_filter_uses_the_clock(admin_client, now):
    fresh = NodeFactory(last_seen_at=now - timedelta(seconds=10))
    boundary = NodeFactory(last_seen_at=now - timedelta(seconds=30))
    stale = NodeFactory(last_seen_at=now - timedelta(seconds=60))

    assert listed_ids(node_list(admin_client, liveness="online")) == {fresh.pk}
    assert listed_ids(node_list(admin_client, liveness="offline")) == {boundary.pk, stale.pk}
    assert listed_ids(node_list(admin_client)) == {fresh.pk, boundary.pk, stale.pk}

    # The filter and the column agree, and both move with the clock.
    from zoekt import clock

    clock.advance(25)
    assert listed_ids(node_list(admin_client, liveness="online")) == set()
    response = node_list(admin_client)
    assert 'alt="True"' not in response.content.decode()


@pytest.mark.parametrize(
    ("used_gib", "level"),
    [
        (0, "normal"),
        (59, "normal"),
        (60, "low"),
        (74, "low"),
        (75, "high"),
        (85, "critical"),
        (100, "critical"),
    ],
)
def test_disk_watermark_filter_and_column_agree(admin_client, now, used_gib, level):
    node = NodeFactory(
        metadata={"name": "zoekt-probe"}, total_bytes=100 * GIB, used_bytes=used_gib * GIB
    )
    others = {
        name: NodeFactory(total_bytes=100 * GIB, used_bytes=used * GIB).pk
        for name, used in (("normal", 1), ("low", 65), ("high", 80), ("critical", 95))
    }

    response = node_list(admin_client, disk_watermark=level)
    assert listed_ids(response) == {node.pk, others[level]}
    assert f">{level}<" in row_of(response, "zoekt-probe")


def test_node_without_disk_report_is_normal(admin_client, now):
    node = NodeFactory(total_bytes=0, used_bytes=0)
    assert listed_ids(node_list(admin_client, disk_watermark="normal")) == {node.pk}
    assert listed_ids(node_list(admin_client, disk_watermark="low")) == set()


def test_schema_version_filter(admin_client, now):
    old = NodeFactory(schema_version=1)
    NodeFactory(schema_version=2)
    assert listed_ids(node_list(admin_client, schema_version=1)) == {old.pk}


def test_node_search(admin_client, now):
    wanted = NodeFactory(metadata={"name": "zoekt-needle"})
    NodeFactory(metadata={"name": "zoekt-hay"})
    assert listed_ids(node_list(admin_client, q="needle")) == {wanted.pk}
    assert listed_ids(node_list(admin_client, q=str(wanted.uuid))) == {wanted.pk}
    assert listed_ids(node_list(admin_client, q=wanted.index_base_url)) == {wanted.pk}


def test_nodes_cannot_be_added(admin_client):
    assert admin_client.get(url(Node, "add")).status_code == 403


def test_node_machine_written_fields_ignore_post(admin_client, now):
    node = NodeFactory(metadata={"name": "zoekt-fixed"}, schema_version=1)
    before = Node.objects.values().get(pk=node.pk)
    page = admin_client.get(url(Node, "change", node.pk))
    lock = now + timedelta(hours=1)
    data = form_data(
        page,
        usable_storage_bytes_locked_until_0=lock.date().isoformat(),
        usable_storage_bytes_locked_until_1=lock.time().isoformat(),
        uuid=uuid.uuid4(),
        used_bytes=1,
        total_bytes=2,
        indexed_bytes=3,
        usable_storage_bytes=4,
        last_seen_at="2020-01-01 00:00:00",
        metadata='{"name": "evil"}',
        schema_version=99,
        services="1",
        index_base_url="http://evil:1",
        search_base_url="http://evil:2",
    )

    response = admin_client.post(url(Node, "change", node.pk), data)

    assert response.status_code == 302
    after = Node.objects.values().get(pk=node.pk)
    assert after["usable_storage_bytes_locked_until"] == lock
    for field in (
        "uuid",
        "used_bytes",
        "total_bytes",
        "indexed_bytes",
        "usable_storage_bytes",
        "last_seen_at",
        "metadata",
        "schema_version",
        "services",
        "index_base_url",
        "search_base_url",
        "created_at",
    ):
        assert after[field] == before[field], field


# --- indices, enabled namespaces, replicas, repositories, tasks ----------------


def test_index_filters_and_search(admin_client, now):
    node = NodeFactory()
    ready = IndexFactory(
        zoekt_node=node,
        state=Index.State.READY,
        used_storage_bytes=7 * GIB,
        reserved_storage_bytes=10 * GIB,
        watermark_level=Index.WatermarkLevel.HIGH_WATERMARK_EXCEEDED,
    )
    other = IndexFactory()
    changelist = url(Index, "changelist")

    response = admin_client.get(changelist, {"state__exact": Index.State.READY})
    assert listed_ids(response) == {ready.pk}
    row = row_of(response, url(Index, "change", ready.pk))
    assert "70.0%" in row
    assert human_bytes(7 * GIB) in row
    assert "high_watermark_exceeded" in row

    assert listed_ids(admin_client.get(changelist, {"watermark_level__exact": 60})) == {ready.pk}
    assert listed_ids(admin_client.get(changelist, {"zoekt_node__id__exact": node.pk})) == {
        ready.pk
    }
    assert listed_ids(admin_client.get(changelist, {"q": str(other.namespace_id)})) == {other.pk}


def test_index_changelist_query_count_does_not_grow(admin_client, now):
    def measure() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(url(Index, "changelist")).status_code == 200
        return len(queries)

    IndexFactory.create_batch(2)
    with_2 = measure()
    IndexFactory.create_batch(10)
    assert measure() == with_2


def test_enabled_namespace_changelist_and_rollout_filter(admin_client, now):
    failed = EnabledNamespaceFactory(
        last_rollout_failed_at=now - timedelta(hours=1), number_of_replicas_override=2
    )
    fine = EnabledNamespaceFactory()
    IndexFactory(zoekt_replica__zoekt_enabled_namespace=fine)
    changelist = url(EnabledNamespace, "changelist")

    response = admin_client.get(changelist)
    assert listed_ids(response) == {failed.pk, fine.pk}
    replicas = url(Replica, "changelist")
    assert f'<a href="{replicas}?zoekt_enabled_namespace__id__exact={fine.pk}">1</a>' in (
        row_of(response, f"{fine.root_namespace.path} (")
    )
    assert listed_ids(admin_client.get(changelist, {"rollout_failed": "yes"})) == {failed.pk}
    assert listed_ids(admin_client.get(changelist, {"rollout_failed": "no"})) == {fine.pk}
    assert listed_ids(admin_client.get(changelist, {"search__exact": 1})) == {failed.pk, fine.pk}
    assert listed_ids(admin_client.get(changelist, {"q": fine.root_namespace.name})) == {fine.pk}


def test_enabled_namespace_edits_only_search_and_override(admin_client, now):
    failed_at = now - timedelta(hours=1)
    enabled = EnabledNamespaceFactory(
        last_rollout_failed_at=failed_at, metadata={"last_used_storage_bytes": 5}
    )
    page = admin_client.get(url(EnabledNamespace, "change", enabled.pk))
    data = form_data(
        page,
        search=False,
        number_of_replicas_override=3,
        root_namespace=GroupFactory().pk,
        metadata='{"last_used_storage_bytes": 1}',
        last_rollout_failed_at="",
    )

    response = admin_client.post(url(EnabledNamespace, "change", enabled.pk), data)

    assert response.status_code == 302
    enabled.refresh_from_db()
    assert enabled.search is False
    assert enabled.number_of_replicas_override == 3
    assert enabled.root_namespace_id == page.context["original"].root_namespace_id
    assert enabled.metadata == {"last_used_storage_bytes": 5}
    assert enabled.last_rollout_failed_at == failed_at


def test_enabled_namespace_rejects_a_non_positive_override(admin_client, now):
    enabled = EnabledNamespaceFactory()
    page = admin_client.get(url(EnabledNamespace, "change", enabled.pk))

    response = admin_client.post(
        url(EnabledNamespace, "change", enabled.pk),
        form_data(page, number_of_replicas_override=0),
    )

    assert response.status_code == 200
    assert "number_of_replicas_override" in response.context["adminform"].form.errors
    enabled.refresh_from_db()
    assert enabled.number_of_replicas_override is None


def test_enabled_namespace_add_requires_a_root_namespace(admin_client, now):
    child = GroupFactory(parent=GroupFactory())
    response = admin_client.post(
        url(EnabledNamespace, "add"), {"root_namespace": child.pk, "search": "on"}
    )
    assert response.status_code == 200
    assert "root_namespace" in response.context["adminform"].form.errors

    root = GroupFactory()
    response = admin_client.post(
        url(EnabledNamespace, "add"), {"root_namespace": root.pk, "search": "on"}
    )
    assert response.status_code == 302
    assert EnabledNamespace.objects.filter(root_namespace=root).exists()


def test_repository_and_task_filters(admin_client, now):
    ready = RepositoryFactory(state=10, size_bytes=3 * GIB)
    RepositoryFactory()
    response = admin_client.get(url(ready, "changelist"), {"state__exact": 10})
    assert listed_ids(response) == {ready.pk}
    assert human_bytes(3 * GIB) in row_of(response, url(ready, "change", ready.pk))

    delete = TaskFactory(task_type=Task.TaskType.DELETE_REPO, state=Task.State.DONE)
    TaskFactory()
    tasks = url(Task, "changelist")
    assert listed_ids(admin_client.get(tasks, {"task_type__exact": 50})) == {delete.pk}
    assert listed_ids(admin_client.get(tasks, {"state__exact": 10})) == {delete.pk}


@pytest.mark.parametrize("model_name", ["Index", "Repository", "Task", "Replica"])
def test_control_plane_rows_are_view_only(admin_client, fleet, model_name):
    model = apps.get_model("zoekt", model_name)
    obj = model.objects.order_by("pk").first()
    before = model.objects.values().get(pk=obj.pk)

    assert admin_client.get(url(model, "add")).status_code == 403
    page = admin_client.get(url(model, "change", obj.pk))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    response = admin_client.post(url(model, "change", obj.pk), {"state": 255, "retries_left": 0})
    assert response.status_code == 403
    assert model.objects.values().get(pk=obj.pk) == before


def test_tasks_cannot_be_deleted(admin_client, fleet):
    task = Task.objects.get()
    assert admin_client.get(url(Task, "delete", task.pk)).status_code == 403


def test_namespace_added_in_admin_gets_traversal_ids(admin_client):
    parent = GroupFactory()
    response = admin_client.post(
        url(parent, "add"),
        {
            "name": "child",
            "path": "child",
            "type": "Group",
            "parent": parent.pk,
            "visibility_level": 20,
        },
    )
    assert response.status_code == 302
    child = parent.children.get()
    assert child.traversal_ids == [parent.pk, child.pk]


# --- application settings -----------------------------------------------------------


def settings_url() -> str:
    return url(ApplicationSetting, "change", 1)


def test_settings_changelist_goes_to_the_single_row(admin_client):
    assert not ApplicationSetting.objects.exists()
    response = admin_client.get(url(ApplicationSetting, "changelist"))
    assert response.status_code == 302
    assert response.url == settings_url()
    assert ApplicationSetting.objects.get().pk == 1
    page = admin_client.get(response.url)
    assert page.status_code == 200
    assert [name for name, _ in page.context["adminform"].fieldsets] == [
        "Indexing",
        "Eviction",
        "Rebalancing",
        "Search",
        "Rollout",
        "Memory",
        "Placement",
        "Limits",
        "Lost nodes",
        "Record",
    ]


def test_settings_fieldsets_cover_every_editable_field():
    model_admin = admin.site._registry[ApplicationSetting]
    shown = {field for _, options in model_admin.fieldsets for field in options["fields"]}
    editable = {f.name for f in ApplicationSetting._meta.concrete_fields if f.editable}
    assert shown - {"updated_at"} == editable


def test_settings_cannot_be_added_twice_or_deleted(admin_client):
    assert admin_client.get(url(ApplicationSetting, "add")).status_code == 200
    app_settings.load_row()
    assert admin_client.get(url(ApplicationSetting, "add")).status_code == 403
    assert admin_client.get(url(ApplicationSetting, "delete", 1)).status_code == 403
    assert ApplicationSetting.objects.count() == 1


def test_settings_save_a_valid_change(admin_client):
    app_settings.load_row()
    assert app_settings.current().lost_node_threshold_seconds == 12 * 3600
    page = admin_client.get(settings_url())

    response = admin_client.post(
        settings_url(),
        form_data(
            page,
            zoekt_lost_node_threshold="2d",
            zoekt_rollout_batch_size=64,
            zoekt_indexing_enabled=True,
        ),
    )

    assert response.status_code == 302
    row = ApplicationSetting.objects.get()
    assert row.zoekt_lost_node_threshold == "2d"
    assert row.zoekt_rollout_batch_size == 64
    assert row.zoekt_indexing_enabled is True
    assert app_settings.current().lost_node_threshold_seconds == 2 * 86400


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("zoekt_lost_node_threshold", "12x"),
        ("zoekt_indexing_timeout", "0"),
        ("zoekt_indexed_file_size_limit", "lots"),
        ("zoekt_rollout_batch_size", 0),
        ("zoekt_cpu_to_tasks_ratio", 0),
        ("zoekt_force_reindexing_percentage", 101),
        ("zoekt_memory_ratio", 0),
        ("zoekt_node_memory_budget_bytes", 0),
    ],
)
def test_settings_reject_an_invalid_value(admin_client, field, value):
    app_settings.load_row()
    before = ApplicationSetting.objects.values().get()
    page = admin_client.get(settings_url())

    response = admin_client.post(
        settings_url(), form_data(page, zoekt_maximum_files=7, **{field: value})
    )

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field]
    assert field in response.content.decode()
    assert ApplicationSetting.objects.values().get() == before


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        pytest.param("32GB", 32 * GIB, id="GB"),
        pytest.param("512mb", 512 * 1024**2, id="MB-any-case"),
        pytest.param(" 2GB ", 2 * GIB, id="spaces"),
        pytest.param(str(3 * GIB), 3 * GIB, id="plain-bytes"),
        pytest.param("", None, id="blank-is-off"),
    ],
)
def test_the_memory_budget_takes_a_size_as_the_other_size_settings_do(admin_client, typed, stored):
    app_settings.load_row()
    page = admin_client.get(settings_url())

    response = admin_client.post(
        settings_url(), form_data(page, zoekt_node_memory_budget_bytes=typed)
    )

    assert response.status_code == 302
    assert ApplicationSetting.objects.get().zoekt_node_memory_budget_bytes == stored
    assert app_settings.current().node_memory_budget_bytes == stored


def test_the_memory_budget_is_shown_back_in_the_unit_it_was_typed_in(admin_client):
    app_settings.update(zoekt_node_memory_budget_bytes=32 * GIB)
    page = admin_client.get(settings_url()).content.decode()
    assert re.search(r'name="zoekt_node_memory_budget_bytes"[^>]*value="32GB"', page)


@pytest.mark.parametrize("typed", ["lots", "1.5GB", "32 GiB", "-1GB", "0GB"])
def test_the_memory_budget_refuses_what_is_not_a_size(admin_client, typed):
    app_settings.load_row()
    before = ApplicationSetting.objects.values().get()
    page = admin_client.get(settings_url())

    response = admin_client.post(
        settings_url(), form_data(page, zoekt_node_memory_budget_bytes=typed)
    )

    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["zoekt_node_memory_budget_bytes"]
    assert ApplicationSetting.objects.values().get() == before


# --- helpers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "-"),
        (0, "0\xa0bytes"),
        (1023, "1023\xa0bytes"),
        (1024, "1.0\xa0KiB"),
        (int(1.5 * GIB), "1.5\xa0GiB"),
        (-1024, "-1.0\xa0KiB"),
        (-10 * GIB, "-10.0\xa0GiB"),
    ],
)
def test_human_bytes(value, expected):
    assert human_bytes(value) == expected
