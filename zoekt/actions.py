"""State changes of the fleet: every write goes through a ``do_*`` function.

Each returns plain data describing what it did, so the Celery task that
calls it can log one line.
"""

from __future__ import annotations

from django.db import transaction

from zoekt.models import Replica


def do_update_replica_states() -> dict[str, int]:
    """Recompute replica states in bulk (reference 2.3).

    A pending replica whose indices are all ready becomes ready; a ready
    replica with any index that is not ready goes back to pending. A replica
    without indices stays pending. Running it twice changes nothing more.
    """
    with transaction.atomic():
        promoted = (
            Replica.objects.filter(state=Replica.State.PENDING)
            .with_all_ready_indices()
            .update(state=Replica.State.READY)
        )
        demoted = (
            Replica.objects.filter(state=Replica.State.READY)
            .with_non_ready_indices()
            .update(state=Replica.State.PENDING)
        )
    return {"replicas_marked_ready": promoted, "replicas_marked_pending": demoted}
