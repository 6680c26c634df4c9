"""Models a fake node (or a simulation) can plug in: disk, memory and search traffic.

Pure Python, no Django. Time comes from an injectable clock (a callable
returning seconds, ``time.monotonic`` by default), so tests step it by hand.

* ``DiskModel``: indexing a repository takes its index size on disk; deleting
  it frees the bytes only ``free_delay`` seconds later (a node removes shard
  files lazily); transient spikes (extra used bytes, e.g. a merge or a
  temporary clone) can be injected, growing linearly over a ramp if asked,
  and clear after their duration.
* ``NamespaceMemoryModel``: the webserver's RSS is ``per_shard_base_bytes`` ×
  the shards loaded plus, over the namespaces held, their index bytes × their
  hotness factor. Hotness follows a Zipf distribution (``zipf_weights``,
  ``ZipfHotness``).
* ``generate_searches``: draws searches over namespaces in proportion to
  their hotness and counts the ones that found no target ("dark").
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence

Clock = Callable[[], float]


# --- disk ------------------------------------------------------------------------------------


class DiskModel:
    """Used bytes of a node's disk: indexes held, deletions not yet freed, transient spikes.

    ``used_bytes()`` is ``indexed_bytes() + pending_free_bytes() + spike_bytes()``.
    Re-indexing a repository held already replaces its index: the new size is
    held at once and the old one is freed after ``free_delay``, as a deletion.
    Thread-safe.
    """

    def __init__(self, *, free_delay: float = 0.0, clock: Clock = time.monotonic) -> None:
        if free_delay < 0:
            raise ValueError("free_delay must be >= 0 seconds")
        self.free_delay = float(free_delay)
        self.clock = clock
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}
        self._pending: list[tuple[float, int]] = []  # (freed at, bytes)
        self._spikes: list[tuple[float, float, float, int]] = []  # (start, ramp, clears, bytes)

    def index(self, repo_id: int, size_bytes: int) -> None:
        """The repository's index now takes ``size_bytes``."""
        if size_bytes < 0:
            raise ValueError("size_bytes must be >= 0")
        with self._lock:
            previous = self._held.get(repo_id)
            self._held[repo_id] = int(size_bytes)
            if previous:
                self._free_later(previous)

    def delete(self, repo_id: int) -> int:
        """Drop the repository's index; its bytes are freed after ``free_delay``. Returns them."""
        with self._lock:
            size = self._held.pop(repo_id, 0)
            if size:
                self._free_later(size)
            return size

    def clear(self) -> int:
        """Drop every index (a truncate); the bytes are freed after ``free_delay``."""
        with self._lock:
            total = sum(self._held.values())
            self._held.clear()
            if total:
                self._free_later(total)
            return total

    def inject_spike(self, extra_bytes: int, duration: float, *, ramp: float = 0.0) -> None:
        """``extra_bytes`` more used for ``duration`` seconds from now.

        With ``ramp`` the bytes grow linearly from 0 over the first ``ramp``
        seconds (temporary files written over hours), then stay until the
        spike clears, all at once, ``duration`` seconds after it started.
        """
        if extra_bytes < 0 or duration < 0 or ramp < 0:
            raise ValueError("a spike needs extra_bytes, duration and ramp >= 0")
        with self._lock:
            start = self.clock()
            self._spikes.append((start, float(ramp), start + duration, int(extra_bytes)))

    def _free_later(self, size: int) -> None:
        self._pending.append((self.clock() + self.free_delay, size))

    def _expire(self) -> None:
        now = self.clock()
        self._pending = [(due, size) for due, size in self._pending if due > now]
        self._spikes = [spike for spike in self._spikes if spike[2] > now]

    def _spiked(self) -> int:
        now = self.clock()
        total = 0
        for start, ramp, _, size in self._spikes:
            share = 1.0 if ramp <= 0 else min(max((now - start) / ramp, 0.0), 1.0)
            total += int(size * share)
        return total

    def held(self) -> dict[int, int]:
        with self._lock:
            return dict(self._held)

    def indexed_bytes(self) -> int:
        with self._lock:
            return sum(self._held.values())

    def pending_free_bytes(self) -> int:
        with self._lock:
            self._expire()
            return sum(size for _, size in self._pending)

    def spike_bytes(self) -> int:
        with self._lock:
            self._expire()
            return self._spiked()

    def used_bytes(self) -> int:
        with self._lock:
            self._expire()
            return (
                sum(self._held.values()) + sum(size for _, size in self._pending) + self._spiked()
            )


# --- hotness and memory ----------------------------------------------------------------------


def zipf_weights(n: int, s: float = 1.0) -> list[float]:
    """Zipf weights of ranks 1..n (``1 / rank**s``), normalised to sum to 1; decreasing."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if s < 0:
        raise ValueError("s must be >= 0")
    raw = [1.0 / (rank**s) for rank in range(1, n + 1)]
    total = sum(raw)
    return [value / total for value in raw]


def zipf_hotness(
    namespace_ids: Sequence[int], s: float = 1.0, *, seed: int = 0
) -> dict[int, float]:
    """Each namespace's share of traffic: Zipf weights dealt to the namespaces in a seeded order."""
    ids = list(namespace_ids)
    order = ids[:]
    random.Random(seed).shuffle(order)
    return dict(zip(order, zipf_weights(len(order), s), strict=True))


@dataclasses.dataclass(frozen=True)
class ZipfHotness:
    """A hotness factor for any namespace id, without knowing the namespaces in advance.

    A namespace's rank among ``ranks`` is fixed by a seeded hash of its id;
    its factor is ``scale`` × its Zipf weight × ``ranks``, so the factors
    average ``scale`` over the ranks.
    """

    ranks: int = 100
    s: float = 1.0
    seed: int = 0
    scale: float = 1.0

    def rank(self, namespace_id: int) -> int:
        digest = hashlib.sha256(f"{self.seed}-{namespace_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.ranks

    def __call__(self, namespace_id: int) -> float:
        weights = _cached_zipf(self.ranks, self.s)
        return self.scale * weights[self.rank(namespace_id)] * self.ranks


_ZIPF_CACHE: dict[tuple[int, float], list[float]] = {}


def _cached_zipf(n: int, s: float) -> list[float]:
    key = (n, s)
    if key not in _ZIPF_CACHE:
        _ZIPF_CACHE[key] = zipf_weights(n, s)
    return _ZIPF_CACHE[key]


@dataclasses.dataclass(frozen=True)
class NamespaceMemoryModel:
    """The webserver's RSS from the shards loaded and the hotness of the namespaces held.

    ``rss = per_shard_base_bytes × shards_loaded + Σ bytes(ns) × hotness(ns)``.
    ``hotness`` is a mapping (namespace id → factor; missing ones get
    ``default_hotness``) or a callable such as ``ZipfHotness``.
    ``memory_limit_bytes``, when set, is reported in ``process_health.webserver``.
    """

    per_shard_base_bytes: int = 2 * 1024**2
    hotness: Mapping[int, float] | Callable[[int], float] = dataclasses.field(
        default_factory=ZipfHotness
    )
    default_hotness: float = 0.0
    memory_limit_bytes: int | None = None

    def factor(self, namespace_id: int | None) -> float:
        if namespace_id is None:
            return self.default_hotness
        if callable(self.hotness):
            return float(self.hotness(namespace_id))
        return float(self.hotness.get(namespace_id, self.default_hotness))

    def rss_bytes(self, shards_loaded: int, bytes_by_namespace: Mapping[int | None, int]) -> int:
        hot = sum(size * self.factor(ns) for ns, size in bytes_by_namespace.items())
        return int(self.per_shard_base_bytes * shards_loaded + hot)


# --- search traffic --------------------------------------------------------------------------


@dataclasses.dataclass
class TrafficResult:
    searches: int
    by_namespace: collections.Counter
    dark: int
    dark_by_namespace: collections.Counter

    @property
    def dark_ratio(self) -> float:
        return self.dark / self.searches if self.searches else 0.0


def generate_searches(
    weights: Mapping[int, float],
    targets_for: Callable[[int], Sequence],
    n: int,
    *,
    seed: int = 0,
) -> TrafficResult:
    """Draw ``n`` searches over namespaces in proportion to ``weights`` (seeded).

    ``targets_for(namespace_id)`` gives the nodes that would answer a search
    of the namespace (asked once per namespace drawn); a search with none is
    dark.
    """
    ids = [ns for ns, weight in weights.items() if weight > 0]
    by_namespace: collections.Counter = collections.Counter()
    dark_by_namespace: collections.Counter = collections.Counter()
    if n > 0 and ids:
        drawn = random.Random(seed).choices(ids, weights=[weights[ns] for ns in ids], k=n)
        by_namespace.update(drawn)
        for ns, count in by_namespace.items():
            if not targets_for(ns):
                dark_by_namespace[ns] = count
    return TrafficResult(
        searches=sum(by_namespace.values()),
        by_namespace=by_namespace,
        dark=sum(dark_by_namespace.values()),
        dark_by_namespace=dark_by_namespace,
    )
