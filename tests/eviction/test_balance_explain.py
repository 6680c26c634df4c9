"""The explain of one index in the fleet's desired balance, from the database:
``GET /api/v1/indices/<id>/balance``, ``manage.py zoekt_balance --explain`` and the
namespace page's Balance section. One report (``eviction.rebalance.index_balance_report``),
staff only, read-only, and the codes of why an index may not move read from the fleet.
"""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from eviction import balance_data, moves, rebalance
from tests.api.test_operator_api import make_user
from tests.eviction.test_balance_api import assert_fixed
from tests.eviction.test_balance_data import full_fleet
from tests.eviction.test_manual_moves import (
    Fleet,
    _restarting,
    moving_elsewhere,
    namespace_on,
    node,
    snapshot,
)
from tests.eviction.test_rebalance import finish_building, report_disks
from tests.factories import GIB
from zoekt import app_settings, clock
from zoekt.models import Index, Move, Node
from zoekt.reasons import Reason
from zoekt.units import binary_size

pytestmark = pytest.mark.django_db


def url(index_id: int) -> str:
    return f"/api/v1/indices/{index_id}/balance"


def first_index(holder: Node) -> Index:
    return holder.indices.order_by("id").first()


def explain(*args: str) -> str:
    out = io.StringIO()
    call_command("zoekt_balance", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


# --- the input: why an index may not move -------------------------------------------


def test_the_input_says_why_each_pinned_index_may_not_move(now):
    src, dst, third = node("src", used=30 * GIB), node("dst"), node("third")
    fleet = Fleet(src, dst, third, namespace_on(src))
    pending = namespace_on(third)
    Index.objects.filter(pk=pending.pk).update(state=Index.State.INITIALIZING)
    replicaless = namespace_on(third)
    Index.objects.filter(pk=replicaless.pk).update(zoekt_replica=None)
    move = moving_elsewhere(fleet, dst)
    offline = node("gone", last_seen_at=clock.now() - timedelta(minutes=1))
    on_offline = namespace_on(offline)
    restarting = node("rebooting")
    on_restarting = namespace_on(restarting)
    _restarting(Fleet(src, restarting, third, on_restarting))

    pinned = {index.id: index.pinned_by for index in balance_data.balance_input().indices}

    assert pinned[fleet.index.id] == ()
    assert pinned[pending.id] == (Reason.MOVE_INDEX_NOT_READY,)
    assert pinned[replicaless.id] == (Reason.MOVE_INDEX_NOT_READY,)
    assert pinned[move.source_index_ref] == (Reason.MOVE_ALREADY_MOVING,)
    assert pinned[move.replacement_index_id] == (
        Reason.MOVE_INDEX_NOT_READY,
        Reason.MOVE_ALREADY_MOVING,
    )
    assert pinned[on_offline.id] == (Reason.BALANCE_SOURCE_OFFLINE,)
    assert pinned[on_restarting.id] == (Reason.BALANCE_SOURCE_IN_MAINTENANCE,)
    movable = {index.id: index.movable for index in balance_data.balance_input().indices}
    assert movable == {index_id: not codes for index_id, codes in pinned.items()}


def test_a_moved_index_and_its_node_say_so_for_24_hours_and_10_minutes(now):
    nodes = full_fleet()
    started = rebalance.run_rebalance()["started"]
    finish_building()
    for _ in range(3):
        moves.advance_moves()
    report_disks()
    done = Move.objects.get(pk=started[0])
    assert done.state == Move.State.DONE
    pinned = {index.id: index.pinned_by for index in balance_data.balance_input().indices}
    # The copy the move built holds its place (moved recently); the node it left settles.
    assert Reason.BALANCE_MOVED_RECENTLY in pinned[done.replacement_index_id]
    assert done.source_node_id == nodes[0].id
    assert Reason.BALANCE_MOVED_RECENTLY in pinned[done.source_index_ref]
    stayed = nodes[0].indices.exclude(pk=done.source_index_ref).order_by("id").first()
    assert pinned[stayed.id] == (Reason.BALANCE_SOURCE_SETTLING,)


# --- the API --------------------------------------------------------------------------


def test_the_explain_says_where_the_index_is_where_it_goes_and_who_could_take_it(api):
    nodes = full_fleet()
    index = first_index(nodes[0])
    before = snapshot()

    response = api.get(url(index.id))

    assert response.status_code == 200
    body = response.json()
    assert snapshot() == before
    assert body["index_id"] == index.id and body["namespace_id"] == index.namespace_id
    assert (body["node_id"], body["node_name"]) == (nodes[0].id, nodes[0].name)
    assert body["node_share"] == pytest.approx(0.7)
    assert body["node_share_without"] == pytest.approx(0.6)
    assert body["stays"] is False and body["stays_reason"] is None
    assert (body["desired_node_id"], body["desired_node_name"]) == (nodes[3].id, nodes[3].name)
    assert (body["move_order"], body["moves_planned"]) == (1, 8)
    assert body["move"]["reason"] == Reason.REBALANCE_BUSIEST_NODE
    assert body["move"]["source_before"] == pytest.approx(0.7)
    assert body["move"]["target_after"] == pytest.approx(0.1)
    assert body["candidate_node_ids"] == [nodes[3].id, nodes[4].id]
    decisions = {entry["node_id"]: entry for entry in body["nodes"]}
    assert set(decisions) == {n.id for n in nodes[1:]}
    assert decisions[nodes[1].id]["decision"] == "no"
    assert decisions[nodes[1].id]["refusals"] == [
        Reason.MOVE_TARGET_NO_DISK_ROOM,
        Reason.BALANCE_MARGIN_NOT_MET,
    ]
    assert decisions[nodes[3].id]["decision"] == "yes" and decisions[nodes[3].id]["desired"]
    assert body["reconciler"]["enabled"] is True
    # One function: the command's JSON is the same report.
    assert json.loads(explain("--explain", str(index.id), "--json")) == body


def test_the_explain_of_an_index_that_may_not_move_names_why_on_every_node(api):
    nodes = full_fleet()
    index = first_index(nodes[0])
    Node.objects.filter(pk=nodes[3].pk).update(
        eviction_cooldown_until=clock.now() + timedelta(hours=6)
    )
    Index.objects.filter(pk=index.pk).update(state=Index.State.PENDING)

    body = api.get(url(index.id)).json()

    assert body["index_refusals"] == [Reason.MOVE_INDEX_NOT_READY]
    assert body["stays"] is True and body["stays_reason"] == Reason.MOVE_INDEX_NOT_READY
    assert body["desired_node_id"] == nodes[0].id and body["move"] is None
    assert body["candidate_node_ids"] == []
    decisions = {entry["node_id"]: entry["refusals"] for entry in body["nodes"]}
    assert decisions[nodes[3].id] == [
        Reason.MOVE_INDEX_NOT_READY,
        Reason.MOVE_TARGET_COOLING_DOWN,
    ]
    assert decisions[nodes[4].id] == [Reason.MOVE_INDEX_NOT_READY]


def test_the_explain_carries_the_reconciler_standing_aside(api):
    nodes = full_fleet()
    Node.objects.filter(pk=nodes[1].pk).update(used_bytes=90 * GIB)

    reconciler = api.get(url(first_index(nodes[0]).id)).json()["reconciler"]

    assert reconciler["standing_aside_reason"] == Reason.REBALANCE_NODE_OVER_HIGH_WATERMARK


@pytest.mark.parametrize("index_id", [987_654, 2**63 + 5])
def test_an_unknown_index_is_a_404_naming_it(api, index_id):
    full_fleet()
    response = api.get(url(index_id))
    assert response.status_code == 404
    assert response.json() == {
        "error": f"index_id: Zoekt index {index_id} not found.",
        "errors": {"index_id": [f"Zoekt index {index_id} not found."]},
    }


def test_without_credentials_it_is_401_and_for_a_non_staff_user_403(now):
    nodes = full_fleet()
    target = url(first_index(nodes[0]).id)
    assert APIClient().get(target).status_code == 401
    member = APIClient()
    token = Token.objects.create(user=make_user("dev", staff=False))
    member.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    response = member.get(target)
    assert response.status_code == 403
    assert "error" in response.json()


def test_the_explain_is_read_in_a_fixed_number_of_queries(api):
    def count() -> int:
        index_id = Index.objects.order_by("id").values_list("id", flat=True).first()
        with CaptureQueriesContext(connection) as queries:
            assert api.get(url(index_id)).status_code == 200
        return len(queries)

    assert_fixed(count)


# --- the command ----------------------------------------------------------------------


def test_the_command_explains_one_index_in_words_and_starts_nothing(now):
    nodes = full_fleet()
    index = first_index(nodes[0])
    before = snapshot()

    text = explain("--explain", str(index.id))

    assert snapshot() == before
    first, second, fourth, fifth = nodes[0], nodes[1], nodes[3], nodes[4]
    assert text.startswith(
        f"Index {index.id} (namespace {index.namespace_id}), {binary_size(10 * GIB)}, memory "
        f"estimate {binary_size(0)}: on {first.name} ({first.id}), at 70.0% (60.0% without "
        "it); lower bound 42.0%, margin 5%.\n"
    )
    assert (
        f"Desired: {fourth.name} ({fourth.id}), move 1 of 8; rebalance_busiest_node: "
        "source 70.0% → 60.0%, target 0.0% → 10.0%, busiest 70.0% → 70.0%."
    ) in text
    assert "Other nodes, for a move now (2 of 4 could take it):" in text
    assert re.search(r"node +move now +share now → with it +refused by", text)
    assert re.search(
        rf"{second.name} \({second.id}\) +no +70.0% → 80.0% +move_target_no_disk_room, "
        "balance_margin_not_met\n",
        text,
    )
    assert re.search(rf"{fourth.name} \({fourth.id}\) +yes +0.0% → 10.0% +the desired node\n", text)
    assert re.search(rf"{fifth.name} \({fifth.id}\) +yes +0.0% → 10.0%\n", text)
    assert text.rstrip().endswith("Nothing was started by this command.")


def test_the_command_says_why_an_index_stays(now):
    nodes = full_fleet()
    stays = nodes[0].indices.order_by("id")[5]
    text = explain("--explain", str(stays.id))
    assert (
        "Desired: stays; balance_other_moves_preferred (the plan's other moves balance its "
        "node first)."
    ) in text
    app_settings.update(zoekt_rebalance_enabled=False)
    Index.objects.filter(pk=stays.pk).update(state=Index.State.PENDING)
    text = explain("--explain", str(stays.id))
    assert "Desired: stays; move_index_not_ready." in text
    assert "It may move to no node now: move_index_not_ready." in text
    assert "Reconciler: off (zoekt_rebalance_enabled)" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--explain", "987654"), "--explain: Zoekt index 987654 not found."),
        (("--explain", "1", "--margin", "2"), "--margin: must be at least 0 and below 1"),
    ],
)
def test_the_command_refuses_an_unknown_index_and_bad_options_naming_them(now, args, message):
    full_fleet()
    before = snapshot()
    with pytest.raises(CommandError) as error:
        explain(*args)
    assert str(error.value) == message
    assert snapshot() == before


# --- the namespace page ---------------------------------------------------------------


def balance_row(html: str, index_id: int) -> str:
    match = re.search(rf'<tr data-balance-index-id="{index_id}".*?</tr>', html, flags=re.S)
    assert match, f"no balance row for index {index_id}"
    return match.group(0)


def text_of(html: str) -> str:
    """The visible words, whitespace collapsed (a tag's edge left no space before , or :)."""
    words = " ".join(re.sub(r"<[^>]+>", " ", html).replace("&rarr;", "→").split())
    return words.replace(" ,", ",").replace(" :", ":")


def test_the_namespace_page_shows_where_the_balance_wants_each_index_and_why(admin_client, now):
    nodes = full_fleet()
    index = first_index(nodes[0])
    root = index.zoekt_enabled_namespace.root_namespace_id

    response = admin_client.get(reverse("dashboard-namespace", args=[root]))

    assert response.status_code == 200
    html = response.content.decode()
    row = text_of(balance_row(html, index.id))
    assert f"{nodes[0].name} 70.0%" in row
    assert f"→ {nodes[3].name} move 1 of 8" in row
    assert "rebalance busiest node: source 70.0% → 60.0%, target 0.0% → 10.0%" in row
    assert row.endswith("2 of 4")
    decisions = re.search(
        rf'<tr class="decisions" data-decisions-index-id="{index.id}">.*?</details>',
        html,
        flags=re.S,
    ).group(0)
    shown = re.findall(r'data-decision-node-id="(\d+)" data-decision="(yes|no)"', decisions)
    assert shown == [
        (str(nodes[1].id), "no"),
        (str(nodes[2].id), "no"),
        (str(nodes[3].id), "yes"),
        (str(nodes[4].id), "yes"),
    ]
    words = text_of(decisions)
    assert f"{nodes[1].name} no 70.0% → 80.0% move target no disk room, balance margin" in words
    assert f"{nodes[3].name} desired yes 0.0% → 10.0% none" in words


def test_the_namespace_page_says_why_an_index_stays(admin_client, now):
    nodes = full_fleet()
    index = nodes[0].indices.order_by("id")[5]
    Index.objects.filter(pk=index.pk).update(state=Index.State.PENDING)
    root = index.zoekt_enabled_namespace.root_namespace_id

    html = admin_client.get(reverse("dashboard-namespace", args=[root])).content.decode()

    row = text_of(balance_row(html, index.id))
    assert "stays" in row
    assert "may move to no node now: move index not ready" in row
    assert row.endswith("0 of 4")
