"""The operator dashboard: server-rendered pages inside the admin (staff only).

``/admin/dashboard/`` (the fleet), ``.../plans/`` and ``.../plans/<id>/``
(recent rollout plans), ``.../namespaces/`` and ``.../namespaces/<root id>/``,
``.../evictions/`` (nodes over the high watermark, in cooldown, and the
eviction decisions), ``.../moves/`` (moves in flight and recent),
``.../maintenance/`` (node shutdown records, live and recent), ``.../balance/`` (the
desired balance and the rebalance reconciler), ``.../audit/`` (the audit trail of
operator actions, filtered).

A link that leads nowhere (an unknown namespace, node or plan id, a filter or sort the page
does not offer, a page number past the end or not a number) is answered by one page in the
dashboard's frame (``problem.html``): what is wrong, why when the view knows, and links
back, with a 404 or a 400 (docs/dashboard.md, "When a link leads nowhere").
Each view reads one function of its page's module in ``dashboard.readmodels`` (a
fixed number of queries) and renders a template under ``templates/zoekt/dashboard/`` that
extends the admin's ``base_site.html``; charts are inline SVG drawn by
``dashboard.charts``, so nothing is fetched at run time. ``admin_view`` wraps
every view: anonymous users are sent to the admin login, non-staff refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.safestring import SafeString

from dashboard import charts, history
from dashboard.readmodels.audit import (
    AUDIT_ACTIONS,
    AUDIT_OUTCOMES,
    AUDIT_VIAS,
    AuditFilters,
    BadFilterValue,
    audit_page,
)
from dashboard.readmodels.balance import balance_page, index_balance
from dashboard.readmodels.capacity import capacity_page
from dashboard.readmodels.common import INDEX_STATE_NAMES, BadPage, UnknownChoice
from dashboard.readmodels.evictions import eviction_page
from dashboard.readmodels.fleet import NodeRow, fleet_overview
from dashboard.readmodels.maintenance import maintenance_page
from dashboard.readmodels.moves import move_page
from dashboard.readmodels.namespaces import (
    NAMESPACE_FILTERS,
    NAMESPACE_SORTS,
    namespace_detail,
    namespace_page,
)
from dashboard.readmodels.plans import PLAN_FILTERS, plan_detail, recent_plans
from gitlab_sync import status as gitlab_status
from planner import records
from zoekt import clock, memory, units
from zoekt.admin import human_bytes
from zoekt.models import Index, Namespace, Node

PAGES = (
    ("fleet", "Fleet"),
    ("plans", "Rollout plans"),
    ("namespaces", "Namespaces"),
    ("evictions", "Evictions"),
    ("moves", "Moves"),
    ("maintenance", "Maintenance"),
    ("balance", "Balance"),
    ("capacity", "Capacity"),
    ("gitlab", "GitLab"),
    ("audit", "Audit"),
)


def _render(request: HttpRequest, template: str, tab: str, title: str, **context) -> HttpResponse:
    return TemplateResponse(
        request,
        f"zoekt/dashboard/{template}",
        {
            **admin.site.each_context(request),
            "title": title,
            "dashboard_pages": PAGES,
            "dashboard_page": tab,
            **context,
        },
    )


# ----------------------------------------------------------------------------
# Dead ends: one page in the dashboard's frame, naming the problem and linking back
# ----------------------------------------------------------------------------


@dataclass
class Problem(Exception):
    """What a view found wrong with its link: the heading, the reason, the links back."""

    status: int
    heading: str
    reason: str
    links: list[tuple[str, str]] = field(default_factory=list)


def _without(request: HttpRequest, *names: str, **values: object) -> str:
    """This page's URL without the query parameters ``names``, with ``values`` set."""
    query = request.GET.copy()
    for name in (*names, *values):
        query.pop(name, None)
    for name, value in values.items():
        query[name] = str(value)
    encoded = query.urlencode()
    return request.path + (f"?{encoded}" if encoded else "")


def _problem_of(request: HttpRequest, error: Exception) -> Problem:
    if isinstance(error, Problem):
        return error
    if isinstance(error, BadPage):
        last = max(error.num_pages, 1)
        return Problem(
            error.status,
            f"No page {error.value}",
            (
                f"There is no page {error.value}: the list has {last} "
                f"page{'' if last == 1 else 's'}."
                if error.past_the_end
                else f"The page {error.value} is not a page number (a whole number from 1)."
            ),
            [
                (_without(request, "page"), "the first page"),
                (_without(request, page=last), f"the last page ({last})"),
            ],
        )
    if isinstance(error, UnknownChoice):
        return Problem(
            400,
            f"Unknown {error.field}",
            f"The {error.field} {error.value} is not known. Choose one of: "
            f"{', '.join(error.choices)}; or leave it out.",
            [
                (_without(request, error.field, "page"), f"without a {error.field}"),
                *(
                    (_without(request, "page", **{error.field: choice}), choice)
                    for choice in error.choices
                ),
            ],
        )
    if isinstance(error, BadFilterValue):
        return Problem(
            400,
            f"Unreadable {error.field}",
            f"The {error.field} {error.value} is not {error.expected}.",
            [(_without(request, error.field, "page"), f"without a {error.field}")],
        )
    raise error


def framed(view: Callable[..., HttpResponse], tab: str) -> Callable[..., HttpResponse]:
    """``view``, whose dead ends (``Problem``, an unknown choice, an unreadable filter, a
    page that is none) are answered in the dashboard's frame with their status."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except (Problem, BadPage, UnknownChoice, BadFilterValue) as error:
            problem = _problem_of(request, error)
        label = dict(PAGES)[tab]
        response = _render(
            request,
            "problem.html",
            tab,
            problem.heading,
            problem=problem,
            back=(reverse(f"dashboard-{tab}"), label),
        )
        response.status_code = problem.status
        return response

    return wrapper


# ----------------------------------------------------------------------------
# Fleet
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeChart:
    node: NodeRow
    disk: SafeString
    memory: SafeString
    budget_bytes: int | None
    budget_source: str | None
    # One unit per row for its sizes (the largest figure's), so 0.8 GiB sits beside 1.0 GiB.
    disk_unit: str
    memory_unit: str


#: The disk and memory bars of a node's row: narrow enough that the node table fits a
#: 1440 px window whole (and scrolls inside its box at 1024 px).
ROW_BAR_WIDTH = 120


def fleet(request: HttpRequest) -> HttpResponse:
    overview = fleet_overview()
    memories = [node.memory for node in overview.nodes if node.memory is not None]
    scale = max(
        (
            value or 0
            for m in memories
            for value in (
                m.estimated_memory_bytes,
                m.rss_bytes,
                m.memory_budget_bytes,
                m.memory_limit_bytes,
            )
        ),
        default=0,
    )
    rows = []
    for node in overview.nodes:
        m = node.memory
        rows.append(
            NodeChart(
                node=node,
                disk=charts.disk_bar(
                    total_bytes=node.total_bytes,
                    used_bytes=node.used_bytes,
                    indexed_bytes=node.indexed_bytes,
                    reserved_bytes=node.reserved_storage_bytes,
                    usable_bytes=node.usable_storage_bytes,
                    limits=overview.watermark_limits,
                    width=ROW_BAR_WIDTH,
                ),
                memory=charts.memory_bars(
                    estimated_bytes=None if m is None else m.estimated_memory_bytes,
                    rss_bytes=None if m is None else m.rss_bytes,
                    budget_bytes=None if m is None else m.memory_budget_bytes,
                    limit_bytes=None if m is None else m.memory_limit_bytes,
                    scale_bytes=scale,
                    watermark_limits=memory.memory_watermark_limits(),
                    width=ROW_BAR_WIDTH,
                ),
                budget_bytes=None if m is None else m.memory_budget_bytes,
                budget_source=None if m is None else m.budget_source,
                disk_unit=units.binary_unit(
                    max(
                        node.total_bytes,
                        node.reserved_storage_bytes,
                        abs(node.unclaimed_storage_bytes),
                    )
                ),
                memory_unit=units.binary_unit(
                    max(
                        (
                            value or 0
                            for value in (
                                None if m is None else m.estimated_memory_bytes,
                                None if m is None else m.rss_bytes,
                                None if m is None else m.memory_budget_bytes,
                            )
                        ),
                        default=0,
                    )
                ),
            )
        )
    total = overview.totals("total_bytes")
    fleet_disk = charts.disk_bar(
        total_bytes=total,
        used_bytes=overview.totals("used_bytes"),
        indexed_bytes=overview.totals("indexed_bytes"),
        reserved_bytes=overview.totals("reserved_storage_bytes"),
        usable_bytes=overview.totals("usable_storage_bytes"),
        limits=overview.watermark_limits,
        width=420,
    )
    return _render(
        request,
        "fleet.html",
        "fleet",
        "Zoekt fleet",
        overview=overview,
        rows=rows,
        fleet_disk=fleet_disk,
        fleet_used_percent=overview.totals("used_bytes") / total if total else 0.0,
        index_states=charts.state_bar(
            overview.indices, charts.INDEX_STATE_COLOURS, width=420, height=14
        ),
        disk_legend=charts.legend(
            [
                (charts.OTHER_USED, "used by others"),
                (charts.INDEXED, "used (inner bar)"),
                (charts.RESERVED, "reserved by indices"),
                (charts.OVERCOMMITTED, "over-committed"),
                (charts.FREE, "free"),
            ],
            line="dashed lines: watermarks "
            + " / ".join(f"{limit:.0%}" for limit in overview.watermark_limits),
        ),
        memory_legend=charts.legend(
            [
                (charts.ESTIMATED, "estimated (repository size × memory ratio)"),
                (charts.OBSERVED, "observed webserver RSS"),
                (charts.BUDGET, "budget"),
                (charts.LIMIT, "reported memory limit (tick)"),
            ],
            line="dashed marks on the RSS bar: memory watermarks "
            + " / ".join(f"{limit:.0%}" for limit in memory.memory_watermark_limits())
            + " of the budget (they apply to RSS, not to the estimate)",
        ),
        memory_scale=human_bytes(scale),
        disk_sparklines=history.disk_sparklines(
            now=overview.now, high_watermark=overview.watermark_limits[1], width=ROW_BAR_WIDTH
        ),
    )


#: The node page's charts, drawn this wide and scaled by CSS to the page's width.
NODE_CHART_WIDTH = 1200


def node(request: HttpRequest, node_id: int) -> HttpResponse:
    """One node's history (``dashboard.history``): disk share, and RSS against the estimate."""
    detail = history.node_history(node_id)
    if detail is None:
        raise Problem(
            404,
            f"No node {node_id}",
            f"There is no node with id {node_id}: it was deleted, or never registered. "
            "A node appears with its first heartbeat.",
            [(reverse("dashboard-maintenance"), "Maintenance (nodes drained or replaced)")],
        )
    limits = detail.watermark_limits
    samples = detail.samples
    gap = 2.5 * history.SAMPLE_INTERVAL_SECONDS
    disk = charts.time_series(
        [("disk used", charts.INDEXED, [(s.sampled_at, s.storage_percent_used) for s in samples])],
        start=detail.chart_start,
        end=detail.now,
        y_max=1.0,
        y_label=lambda value: f"{value:.0%}",
        gap_seconds=gap,
        guides=[
            (limit, colour, f"{name} watermark {limit:.0%}")
            for limit, colour, name in zip(
                limits, charts.WATERMARK_COLOURS, ("low", "high", "critical"), strict=False
            )
        ],
        label=f"disk used by {detail.name} over the last {history.RETENTION_SECONDS // 86400} days",
        width=NODE_CHART_WIDTH,
    )
    memory_series = [
        ("RSS", charts.OBSERVED, [(s.sampled_at, s.rss_bytes) for s in samples]),
        (
            "estimated",
            charts.ESTIMATED,
            [(s.sampled_at, s.estimated_memory_bytes) for s in samples],
        ),
        ("budget", charts.BUDGET, [(s.sampled_at, s.memory_budget_bytes) for s in samples]),
    ]
    memory_max = max(
        (value for _, _, points in memory_series for _, value in points if value is not None),
        default=0,
    )
    memory = charts.time_series(
        memory_series,
        start=detail.chart_start,
        end=detail.now,
        y_max=memory_max * 1.05,
        y_label=lambda value: human_bytes(int(value)),
        gap_seconds=gap,
        label=f"memory of {detail.name}: RSS, estimate and budget",
        width=NODE_CHART_WIDTH,
    )
    # Its row of the fleet page (online, searchable, disk, tasks, eviction clock, shutdown),
    # and what it holds: its indices with their namespaces.
    state = next((row for row in fleet_overview().nodes if row.id == node_id), None)
    indices = [
        {
            "id": index.id,
            "state": INDEX_STATE_NAMES.get(index.state, str(index.state)),
            "root_namespace_id": None
            if index.zoekt_enabled_namespace is None
            else index.zoekt_enabled_namespace.root_namespace_id,
            "path": None
            if index.zoekt_enabled_namespace is None
            else index.zoekt_enabled_namespace.root_namespace.path,
            "replica_id": index.zoekt_replica_id,
            "project_namespace_id_from": (index.project_namespace_id_range or (None, None))[0],
            "project_namespace_id_to": (index.project_namespace_id_range or (None, None))[1],
            "used_storage_bytes": index.used_storage_bytes,
            "reserved_storage_bytes": index.reserved_storage_bytes,
        }
        for index in Index.objects.filter(zoekt_node_id=node_id)
        .select_related("zoekt_enabled_namespace__root_namespace")
        .order_by("zoekt_enabled_namespace__root_namespace_id", "id")
    ]
    return _render(
        request,
        "node_detail.html",
        "fleet",
        f"Node {detail.name}",
        detail=detail,
        state=state,
        indices=indices,
        namespace_count=len({i["root_namespace_id"] for i in indices} - {None}),
        disk_chart=disk,
        memory_chart=memory,
        disk_legend=charts.legend(
            [(charts.INDEXED, "disk used ÷ total (peak per pixel)")],
            line="dashed lines: watermarks " + " / ".join(f"{limit:.0%}" for limit in limits),
        ),
        memory_legend=charts.legend(
            [
                (charts.OBSERVED, "observed webserver RSS"),
                (charts.ESTIMATED, "estimated (repository size × memory ratio)"),
                (charts.BUDGET, "budget"),
            ]
        ),
        interval_minutes=history.SAMPLE_INTERVAL_SECONDS // 60,
        retention_days=history.RETENTION_SECONDS // 86400,
    )


def node_named(request: HttpRequest, name: str) -> HttpResponse:
    """The node page of the node called ``name`` (the most recently seen, should two share
    it): how pages that keep a node's name, not its id (plans, moves), link to it."""
    node_id = (
        Node.objects.filter(metadata__name=name)
        .order_by("-last_seen_at", "-id")
        .values_list("id", flat=True)
        .first()
    )
    if node_id is None:
        raise Problem(
            404,
            f"No node {name}",
            f"No node is called {name} now: it was deleted, or renamed (a plan or a move "
            "keeps the name the node had then).",
        )
    return redirect("dashboard-node", node_id)


# ----------------------------------------------------------------------------
# Plans
# ----------------------------------------------------------------------------


def plans(request: HttpRequest) -> HttpResponse:
    return _render(
        request,
        "plans.html",
        "plans",
        "Recent rollout plans",
        plans=recent_plans(),
    )


def plan(request: HttpRequest, plan_id: int) -> HttpResponse:
    current = request.GET.get("filter", "")
    if current not in PLAN_FILTERS:
        raise UnknownChoice("filter", current, PLAN_FILTERS)
    detail = plan_detail(plan_id, filter=current, page=request.GET.get("page", 1))
    if detail is None:
        raise Problem(
            404,
            f"No rollout plan {plan_id}",
            f"Rollout plan {plan_id} is not kept: only the last {records.KEEP} plans are "
            "kept, dry runs included, and a plan id never comes back.",
        )
    return _render(
        request,
        "plan_detail.html",
        "plans",
        f"Rollout plan {plan_id}",
        detail=detail,
        filters=PLAN_FILTERS,
        current_filter=current,
    )


# ----------------------------------------------------------------------------
# Namespaces
# ----------------------------------------------------------------------------


def namespaces(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")
    current = request.GET.get("filter", "")
    sort = request.GET.get("sort", "")
    page, rows = namespace_page(
        query=query, filter=current, sort=sort, page=request.GET.get("page", 1)
    )
    return _render(
        request,
        "namespaces.html",
        "namespaces",
        "Enabled namespaces",
        page=page,
        rows=rows,
        query=query,
        filters=NAMESPACE_FILTERS,
        sorts=NAMESPACE_SORTS,
        current_filter=current,
        current_sort=sort,
    )


def namespace(request: HttpRequest, root_namespace_id: int) -> HttpResponse:
    detail = namespace_detail(root_namespace_id)
    if detail is None:
        raise Problem(
            404, f"Namespace {root_namespace_id} not enabled", *_not_enabled(root_namespace_id)
        )
    indices = [index for replica in detail.replicas for index in replica.indices]
    indices += detail.detached_indices
    return _render(
        request,
        "namespace_detail.html",
        "namespaces",
        f"Namespace {detail.root.path}",
        detail=detail,
        balance=index_balance([index.id for index in indices]),
    )


def _not_enabled(namespace_id: int) -> tuple[str, list[tuple[str, str]]]:
    """Why a namespace has no page: unknown, not a root, or a root not enabled for Zoekt."""
    known = Namespace.objects.filter(pk=namespace_id).values_list("path", "traversal_ids").first()
    if known is None:
        return (
            f"There is no namespace {namespace_id} in the catalog (the bulk API or the "
            "GitLab sync fills it).",
            [],
        )
    path_, traversal = known
    if traversal and traversal[0] != namespace_id:
        return (
            f"{path_} ({namespace_id}) is not a root namespace: Zoekt enables and indexes "
            f"its root, {traversal[0]}.",
            [
                (
                    reverse("dashboard-namespace", args=[traversal[0]]),
                    f"root namespace {traversal[0]}",
                )
            ],
        )
    return (
        f"The root namespace {path_} ({namespace_id}) is not enabled for Zoekt: it has no "
        "enabled namespace row, so nothing of it is indexed.",
        [],
    )


# ----------------------------------------------------------------------------
# Evictions
# ----------------------------------------------------------------------------


def evictions(request: HttpRequest) -> HttpResponse:
    return _render(
        request,
        "evictions.html",
        "evictions",
        "Evictions",
        evictions=eviction_page(page=request.GET.get("page", 1)),
    )


def moves(request: HttpRequest) -> HttpResponse:
    return _render(
        request,
        "moves.html",
        "moves",
        "Moves",
        moves=move_page(page=request.GET.get("page", 1)),
        page=None,
    )


def maintenance(request: HttpRequest) -> HttpResponse:
    """Node shutdown records (docs/operations.md): live, and a page of the ended ones."""
    return _render(
        request,
        "maintenance.html",
        "maintenance",
        "Maintenance",
        maintenance=maintenance_page(page=request.GET.get("page", 1)),
    )


def balance(request: HttpRequest) -> HttpResponse:
    """The desired balance and the rebalance reconciler (docs/balance.md): per node now and
    desired, the moves left, converged or not, and what the reconciler is doing."""
    return _render(request, "balance.html", "balance", "Balance", balance=balance_page())


def capacity(request: HttpRequest) -> HttpResponse:
    """The provisioning status now and in 30 and 90 days, with the forecast chart
    (docs/capacity.md, "Provisioning and what-if")."""
    return _render(request, "capacity.html", "capacity", "Capacity", capacity=capacity_page())


def gitlab(request: HttpRequest) -> HttpResponse:
    """Following GitLab (docs/gitlab.md): the sweeps and the system hooks' backlog."""
    return _render(
        request,
        "gitlab.html",
        "gitlab",
        "GitLab",
        gitlab=gitlab_status.status(clock.now()),
        sweeps=gitlab_status.recent_sweeps(),
        hooks=gitlab_status.recent_hooks(),
    )


def audit(request: HttpRequest) -> HttpResponse:
    """The audit trail (docs/operations.md, "Audit trail"): newest first, filtered; a
    filter value the page cannot read is a 400 naming it (``framed``)."""
    filters = AuditFilters(
        **{field: request.GET.get(field, "") for field in AuditFilters.__dataclass_fields__}
    )
    context = {
        "filters": filters,
        "actions": AUDIT_ACTIONS,
        "vias": AUDIT_VIAS,
        "outcomes": AUDIT_OUTCOMES,
    }
    trail = audit_page(filters, page=request.GET.get("page", 1))
    return _render(request, "audit.html", "audit", "Audit", trail=trail, **context)


def urls() -> list:
    def view(function: Callable[..., HttpResponse], tab: str):
        return admin.site.admin_view(framed(function, tab))

    return [
        path("", view(fleet, "fleet"), name="dashboard-fleet"),
        path("nodes/<int:node_id>/", view(node, "fleet"), name="dashboard-node"),
        path("nodes/named/<str:name>/", view(node_named, "fleet"), name="dashboard-node-named"),
        path("plans/", view(plans, "plans"), name="dashboard-plans"),
        path("plans/<int:plan_id>/", view(plan, "plans"), name="dashboard-plan"),
        path("namespaces/", view(namespaces, "namespaces"), name="dashboard-namespaces"),
        path("moves/", view(moves, "moves"), name="dashboard-moves"),
        path("maintenance/", view(maintenance, "maintenance"), name="dashboard-maintenance"),
        path("balance/", view(balance, "balance"), name="dashboard-balance"),
        path("capacity/", view(capacity, "capacity"), name="dashboard-capacity"),
        path("audit/", view(audit, "audit"), name="dashboard-audit"),
        path(
            "namespaces/<int:root_namespace_id>/",
            view(namespace, "namespaces"),
            name="dashboard-namespace",
        ),
        path("evictions/", view(evictions, "evictions"), name="dashboard-evictions"),
        path("gitlab/", view(gitlab, "gitlab"), name="dashboard-gitlab"),
    ]
