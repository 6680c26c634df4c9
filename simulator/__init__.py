"""Simulated fleet members that talk to the control plane over HTTP only.

``simulator.fakenode`` is a protocol-faithful fake of GitLab's
``gitlab-zoekt-indexer`` node: it keeps its uuid in a file, signs GitLab
Shell's JWT, heartbeats to ``/api/v4/internal/search/zoekt/<uuid>/heartbeat``,
follows ``pull_frequency``, ``truncate`` and ``stop_indexing``, executes the
tasks it is handed with configurable delays and success rates, reports disk
use and ``process_health`` from a simple model, and calls back. It is used by
the tests, the demo and simulations, and deliberately imports nothing from
Django or the rest of the project, so it runs anywhere PyJWT is installed.
"""
