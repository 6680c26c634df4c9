"""Placement planning: which node holds which part of which namespace.

A pure core (scenario in, plan out, no Django import) and the database edge
that loads a scenario and applies a plan. ``planner/README.md`` draws the
pipeline and defines its words.
"""
