"""What the replays (``bench/replay_*.py``) share: a scratch database and the charts."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GIB = 1024**3
MIB = 1024**2


def setup_django(suffix: str) -> str:
    """A fresh, migrated scratch database ``<DATABASE_URL name>_<suffix>``; returns its name.

    Logs below WARNING are not shown (a replay runs thousands of jobs).
    """
    from bench import scratch

    _, name = scratch.setup_django(suffix)
    clear_cache()
    return name


def clear_cache() -> None:
    """Drop this replay's cache keys (its prefix), not the whole Redis database."""
    import redis
    from django.conf import settings

    from zoekt import app_settings

    config = settings.CACHES["default"]
    client = redis.Redis.from_url(config["LOCATION"])
    for key in client.scan_iter(match=f"{config['KEY_PREFIX']}:*", count=1000):
        client.delete(key)
    app_settings.invalidate()


def reset_database() -> None:
    """Empty every table of the scratch database between two runs of one replay."""
    from django.core.management import call_command

    call_command("flush", verbosity=0, interactive=False)
    clear_cache()


def hours(seconds: float) -> float:
    return seconds / 3600


def clock_text(seconds: float | None) -> str:
    """``1 h 05 min`` / ``12 min 20 s``; ``-`` for None."""
    if seconds is None:
        return "-"
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {s:02d} s"
    return f"{s} s"


def node_series(samples: Sequence, name: str, field: str) -> list[float | None]:
    """One node's ``field`` over the samples, in GiB; None while the node is down."""
    out: list[float | None] = []
    for sample in samples:
        node = sample.nodes.get(name)
        if node is None or not node.alive:
            out.append(None)
        else:
            out.append(getattr(node, field) / GIB)
    return out


def plot_runs(
    runs: Sequence[tuple[str, object]],
    path: Path,
    *,
    title: str,
    memory_line: tuple[float, str] | None = None,
    dark_per_minute: bool = False,
    fields: Sequence[str] = ("disk_used_bytes", "rss_bytes"),
) -> None:
    """One column per run: per-node disk used and webserver RSS over simulated hours.

    ``runs`` holds (label, replay); rows share their y axis so the columns
    compare at a glance. ``fields`` picks the per-node rows (disk used, RSS).
    ``memory_line`` draws a level (GiB, label) on the RSS row; with
    ``dark_per_minute`` a last row shows the dark searches of each traffic
    sample. The replay's events are vertical lines, named on top.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"disk_used_bytes": "disk used, GiB", "rss_bytes": "webserver RSS, GiB"}
    rows = len(fields) + (1 if dark_per_minute else 0)
    fig, axes = plt.subplots(
        rows,
        len(runs),
        figsize=(5.2 * len(runs), 2.9 * rows),
        sharex="col",
        sharey="row",
        squeeze=False,
    )
    for column, (label, replay) in enumerate(runs):
        samples = replay.samples
        t = [hours(sample.t) for sample in samples]
        names = list(replay.nodes)
        for row, field in enumerate(fields):
            ylabel = labels[field]
            ax = axes[row][column]
            for name in names:
                ax.plot(t, node_series(samples, name, field), label=name, linewidth=1.4)
            if field == "rss_bytes" and memory_line:
                level, text = memory_line
                ax.axhline(level, color="grey", linestyle="--", linewidth=0.8)
                ax.annotate(
                    text,
                    (0, level),
                    textcoords="offset points",
                    xytext=(2, 3),
                    fontsize=7,
                    color="grey",
                )
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(label, fontsize=10)
        for when, text in replay.events:
            for row in range(rows):
                axes[row][column].axvline(hours(when), color="#c44", linewidth=0.6, alpha=0.5)
            top = axes[0][column]
            top.annotate(
                text,
                (hours(when), 1),
                xycoords=("data", "axes fraction"),
                xytext=(2, -2),
                textcoords="offset points",
                rotation=90,
                va="top",
                fontsize=7,
                color="#a33",
            )
        if dark_per_minute:
            ax = axes[rows - 1][column]
            points = [(hours(s.t), s.dark) for s in samples if s.searches]
            ax.fill_between(
                [p[0] for p in points], [p[1] for p in points], step="post", color="#c44"
            )
            ax.set_ylabel("dark searches / sample")
            ax.grid(alpha=0.3)
        axes[rows - 1][column].set_xlabel("simulated hours")
        axes[len(fields) - 1][column].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def traffic_replay(args, index_sizes: dict[int, int], traffic, *, node_concurrency: int = 8):
    """A ``simulator.replay.Replay`` as the eviction, rolling-restart and drain replays
    build it: each repository's index size (1 MiB when unknown), Zipf search traffic,
    and indexing that takes time (``args.rate_mib`` MiB/s of index a task,
    ``node_concurrency`` tasks a node); ``args`` gives the tick, the searches a
    simulated minute and the seed."""
    from simulator.replay import Replay

    return Replay(
        index_size=lambda repo_id: index_sizes.get(repo_id, MIB),
        traffic=traffic,
        searches_per_sample=args.searches_per_minute,
        tick_seconds=args.tick,
        indexing_bytes_per_second=args.rate_mib * MIB,
        node_concurrency=node_concurrency,
        seed=args.seed,
    )


def held_progress(label: str, started: float, *, quiet: bool, digits: int = 0):
    """A replay's ``progress`` callback: every simulated half hour, the namespaces short of
    their replicas and the GiB of index each node holds, on stderr (nothing if ``quiet``)."""
    import time

    from simulator.replay import fleet_state

    def progress(r) -> None:
        if quiet or int(r.t) % 1800:
            return
        state = fleet_state()
        held = " ".join(
            f"{n[-1]}:{node.fake.indexed_bytes() / GIB:.{digits}f}" for n, node in r.nodes.items()
        )
        print(
            f"  [{label[:20]}] {clock_text(r.t):>13}  short "
            f"{state['namespaces_short']}/{state['namespaces']}  held {held}  "
            f"wall {time.perf_counter() - started:.0f}s",
            file=sys.stderr,
        )

    return progress


def run_all(specs, run_once) -> tuple[list, list]:
    """Call ``run_once(label, option)`` for each spec; returns the (label, replay)s, the results."""
    runs, results = [], []
    for label, option in specs:
        print(f"run: {label}", file=sys.stderr)
        replay, result = run_once(label, option)
        runs.append((label, replay))
        results.append(result)
    return runs, results


def finish(runs, results, *, chart: Path, json_path: Path | None, **plot) -> None:
    """Draw the chart of ``runs`` and write ``results`` as JSON when asked."""
    import json

    plot_runs(runs, chart, **plot)
    print(f"\nchart: {chart}")
    if json_path:
        json_path.write_text(json.dumps(results, indent=2, default=str))
