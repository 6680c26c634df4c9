from django.apps import AppConfig


class SimulatorConfig(AppConfig):
    """The demo's management commands (``zoekt_demo_seed``, ``_drive``, ``_traffic``).

    An app only so Django finds those commands; it has no tables.
    ``simulator.models`` holds the fake node's disk, memory and traffic models,
    plain Python that Django imports and finds no model in. The fake node
    itself (``simulator.fakenode``) still imports nothing from Django.
    """

    name = "simulator"
    verbose_name = "Simulator"
