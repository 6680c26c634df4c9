"""Keys the node API ignored: counted in Redis for ``/metrics``, logged once per node and key.

GitLab's API ignores the parameters it does not declare, and so does this
one (``api.serializers``); a node newer than the control plane, or a typo in
a node's request, shows up here instead. Every request that carries such a
key adds one to ``zoekt_control_node_api_unknown_keys_total{endpoint,key}``,
kept in one Redis hash under the cache's key prefix so every web replica
counts into, and reads, the same figures. ``key`` is the key's dotted path
from the top of the body (``process_health.indexer.restarts``).

Bounded, because nodes choose the keys: at most ``MAX_KEYS_PER_REQUEST``
keys of one request are counted by name, a label is cut to
``MAX_KEY_LENGTH`` characters, and once the hash holds ``MAX_SERIES``
series a new key counts as ``OTHER``; the check and the increments are one
Lua script, so a request costs one Redis round trip, and a request without
unknown keys none. The log line (``node_api_unknown_key``) is written once
per (endpoint, node, key) per process, remembered in a set of at most
``LOGGED_MAX`` entries that forgets the oldest first.

Counting is best effort: a Redis error is logged and the request is unaffected.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Any

from zoekt.logging import get_logger

log = get_logger(__name__)

OTHER = "__other__"
MAX_SERIES = 1000
MAX_KEYS_PER_REQUEST = 32
MAX_KEY_LENGTH = 128
LOGGED_MAX = 10_000

# KEYS[1]: the hash; ARGV[1]: MAX_SERIES; then (field, fallback field, increment) triples.
_COUNT_SCRIPT = """
local max = tonumber(ARGV[1])
for i = 2, #ARGV, 3 do
  local field = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], field) == 0 and redis.call('HLEN', KEYS[1]) >= max then
    field = ARGV[i + 1]
  end
  redis.call('HINCRBY', KEYS[1], field, tonumber(ARGV[i + 2]))
end
return 0
"""

_lock = threading.Lock()
_client: Any = None
_script: Any = None
_logged: OrderedDict[tuple[str, str, str], None] = OrderedDict()


def _redis():
    """A client on the cache's Redis database (made once per process)."""
    global _client
    with _lock:
        if _client is None:
            import redis
            from django.conf import settings

            _client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
        return _client


def _key() -> str:
    from django.conf import settings

    return f"{settings.CACHES['default']['KEY_PREFIX']}:node_api:unknown_keys"


def label(key: str) -> str:
    """The key as a label value and in the log: valid UTF-8, at most MAX_KEY_LENGTH characters."""
    text = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:MAX_KEY_LENGTH]


def _field(endpoint: str, key: str) -> str:
    return f"{endpoint}:{key}"


def note_unknown_keys(endpoint: str, node: str, keys: Iterable[str]) -> None:
    """Count one request's unknown ``keys`` and log those not yet logged for this node."""
    names = sorted({label(key) for key in keys})
    if not names:
        return
    counted, rest = names[:MAX_KEYS_PER_REQUEST], len(names) - MAX_KEYS_PER_REQUEST
    _log_new(endpoint, label(node), counted)
    increments = Counter({_field(endpoint, name): 1 for name in counted})
    if rest > 0:
        increments[_field(endpoint, OTHER)] += rest
    try:
        _count(endpoint, increments)
    except Exception as exc:  # a request never fails for its metrics
        log.warning(
            "node_api_unknown_keys_not_counted",
            endpoint=endpoint,
            error=f"{type(exc).__name__}: {exc}",
        )


def _log_new(endpoint: str, node: str, names: list[str]) -> None:
    fresh = []
    with _lock:
        for name in names:
            pair = (endpoint, node, name)
            if pair in _logged:
                _logged.move_to_end(pair)
                continue
            _logged[pair] = None
            while len(_logged) > LOGGED_MAX:
                _logged.popitem(last=False)
            fresh.append(name)
    for name in fresh:
        log.warning("node_api_unknown_key", endpoint=endpoint, node_uuid=node, key=name)


def _count(endpoint: str, increments: Counter) -> None:
    global _script
    client = _redis()
    if _script is None or _script.registered_client is not client:
        _script = client.register_script(_COUNT_SCRIPT)
    args: list[Any] = [MAX_SERIES]
    fallback = _field(endpoint, OTHER)
    for field, amount in increments.items():
        args.extend((field, fallback, amount))
    _script(keys=[_key()], args=args)


def read() -> list[tuple[str, str, int]]:
    """Every counted (endpoint, key, requests), sorted (one round trip)."""
    raw = _redis().hgetall(_key())
    rows = []
    for field, value in raw.items():
        endpoint, _, key = field.decode().partition(":")
        rows.append((endpoint, key, int(value)))
    return sorted(rows)


def reset() -> None:
    """Forget every count and every logged key (tests, and an operator starting over)."""
    with _lock:
        _logged.clear()
    _redis().delete(_key())
