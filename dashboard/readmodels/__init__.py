"""Read models: what the dashboard, ``/metrics`` and operator commands show, in few queries.

One module per page, each function reading the database with a fixed number of
queries, whatever the number of nodes, namespaces, indices or plans (the
dashboard's tests count them with 3 and with 30 of each), and returning plain
dataclasses a template, a Prometheus collector or ``zoekt_info`` can read
without touching the ORM:

* ``fleet``: ``fleet_overview`` (the fleet page, ``/metrics``, ``zoekt_info``);
* ``namespaces``: ``namespace_page`` and ``namespace_detail``;
* ``plans``: ``recent_plans`` and ``plan_detail``;
* ``evictions``: ``eviction_page``;
* ``moves``: ``move_page``;
* ``maintenance``: ``node_maintenance`` (the fleet's marks) and ``maintenance_page``;
* ``common``: the state names and the helpers the pages share.

The node page's history is ``dashboard.history``; the GitLab page's is
``gitlab_sync.status``. Memory figures come from ``zoekt.memory`` (budgets,
estimate, observed ratios) rather than being computed a second time here.

Import from the page's module; the names below are re-exported for callers that
take the read models as one namespace (the tests, a shell).
"""

from dashboard.readmodels.common import UnknownChoice
from dashboard.readmodels.evictions import EvictionPage, eviction_page
from dashboard.readmodels.fleet import FleetOverview, NodeRow, fleet_overview
from dashboard.readmodels.maintenance import MaintenancePage, maintenance_page, node_maintenance
from dashboard.readmodels.moves import MovePage, move_page
from dashboard.readmodels.namespaces import (
    NAMESPACE_FILTERS,
    NAMESPACE_SORTS,
    NamespaceDetail,
    namespace_detail,
    namespace_page,
)
from dashboard.readmodels.plans import PLAN_FILTERS, PlanDetail, plan_detail, recent_plans

__all__ = [
    "NAMESPACE_FILTERS",
    "NAMESPACE_SORTS",
    "PLAN_FILTERS",
    "EvictionPage",
    "FleetOverview",
    "MaintenancePage",
    "MovePage",
    "NamespaceDetail",
    "NodeRow",
    "PlanDetail",
    "UnknownChoice",
    "eviction_page",
    "fleet_overview",
    "maintenance_page",
    "move_page",
    "namespace_detail",
    "namespace_page",
    "node_maintenance",
    "plan_detail",
    "recent_plans",
]
