"""Replay: a node that really fills and stays over the high watermark past the sustain period.

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_sustained_overfill.py``; it uses the scratch database
``<name>_replay_overfill``. The fleet, the settings and the columns are those
of ``bench/replay_transient_spike.py``; here the 740 GiB written on ``zoekt-0``
over 2 hours stay (index growth the node keeps), so it is over 75 % for
longer than the 8 h sustain period. Four runs: legacy (GitLab's delete-first),
``delete`` and ``delete-largest`` (the safeguards with moves off, each
eviction order) and ``safeguards`` (the product's default: moves). With the
safeguards the node is evicted from once, ends under the low watermark, no
namespace is evicted twice and nothing is placed back on it during its
cooldown; with moves no namespace goes dark. The chart goes to
``docs/replays/sustained_overfill.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replay_transient_spike import DELETE, DELETE_LARGEST, LEGACY, SAFEGUARDS, Scenario, main

SCENARIO = Scenario(
    name="sustained_overfill",
    title="Sustained overfill on zoekt-0 (+740 GiB over 2 h that stays)",
    suffix="replay_overfill",
    spike_gib=740.0,
    spike_ramp_hours=2.0,
    spike_hours=None,
    after_hours=22.0,
    # GitLab's delete-first; the safeguards deleting, with each order; and moves.
    modes=(LEGACY, DELETE, DELETE_LARGEST, SAFEGUARDS),
)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sys.exit(main(SCENARIO, parser))
