"""Beat entry of the eviction package's own job, declared in code (merged into
``zoekt.celery``). The three triggers are dispatched by the scheduling service;
moving what they chose on is this entry's. Plain data with no Django import."""

from __future__ import annotations

#: How often live moves are taken one step further (``eviction.moves``).
ADVANCE_MOVES_SECONDS = 60

EVICTION_BEAT: dict[str, dict] = {
    "advance-moves": {
        "task": "eviction.advance_moves",
        "schedule": float(ADVANCE_MOVES_SECONDS),
        "options": {"expires": ADVANCE_MOVES_SECONDS},
    },
}
