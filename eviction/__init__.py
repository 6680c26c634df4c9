"""Eviction and moves: what to take off an overfull node, and how to move it.

A pure policy (what to evict or move, and why, as data) and the actions that
carry it out: evict, or build an extra replica elsewhere and swap.
"""
