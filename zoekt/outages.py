"""What an outage of PostgreSQL, Redis or the Celery broker looks like to the code.

The API answers any of these with 503, the JSON error shape and
``Retry-After`` (``api.errors``); code that uses Redis only as a cache
catches ``REDIS_ERRORS`` and goes on without it (``zoekt.app_settings``).
Django's ``OperationalError`` also covers transient refusals that are not an
outage (a serialisation failure, a deadlock victim): a retry is the right
answer to those too.
"""

from __future__ import annotations

import redis
from django.db import InterfaceError, OperationalError
from kombu.exceptions import OperationalError as BrokerError

#: The database did not answer, or dropped the connection.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)
#: Redis (the cache) did not answer.
REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.exceptions.RedisError,)
#: The Celery broker (Redis) refused a message.
BROKER_ERRORS: tuple[type[BaseException], ...] = (BrokerError, redis.exceptions.RedisError)

#: Seconds a client is asked to wait before trying again (a node heartbeats every 5 s
#: or so; a few beats is short enough to miss little and long enough not to pile on).
RETRY_AFTER_SECONDS = 10


def which(exc: BaseException) -> str | None:
    """``database`` or ``redis`` for an outage error, else None."""
    if isinstance(exc, DATABASE_ERRORS):
        return "database"
    if isinstance(exc, REDIS_ERRORS + BROKER_ERRORS):
        return "redis"
    return None
