"""Stable snake_case reason codes that decisions carry as data.

A code is never renamed or reused, only added: logs, dashboards and tests
match on them.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    # Periodic jobs
    LOCK_HELD = "lock_held"
    # Buffer factor
    BUFFER_FACTOR_OBSERVED = "buffer_factor_observed"
    BUFFER_FACTOR_NO_OBSERVATIONS = "buffer_factor_no_observations"
