"""``zoekt.search_targets.cover``, the pure rule search routes by: properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zoekt.search_targets import HIGHEST, LOWEST, Span, cover

BOUNDS = st.one_of(st.none(), st.integers(0, 40))


@st.composite
def spans(draw) -> list[Span]:
    out = []
    for index_id in range(1, draw(st.integers(0, 8)) + 1):
        low, high = draw(BOUNDS), draw(BOUNDS)
        if low is not None and high is not None and low > high:
            low, high = high, low
        out.append(
            Span(
                index_id=index_id,
                replica_id=draw(st.integers(1, 3)),
                node_id=index_id,
                project_namespace_id_from=low,
                project_namespace_id_to=high,
            )
        )
    return out


def covered_by_any(points: int, all_spans: list[Span]) -> bool:
    return any(span.low <= points <= span.high for span in all_spans)


@settings(max_examples=400, deadline=None)
@given(spans())
def test_a_cover_serves_every_id_exactly_once_within_each_index(all_spans):
    pieces = cover(all_spans)
    probes = [LOWEST, *range(-1, 43), HIGHEST]
    if pieces is None:
        # None only when some id has no span at all (the probes include every boundary).
        assert any(not covered_by_any(point, all_spans) for point in probes)
        return
    for point in probes:
        owners = [
            p
            for p in pieces
            if (LOWEST if p.project_namespace_id_from is None else p.project_namespace_id_from)
            <= point
            <= (HIGHEST if p.project_namespace_id_to is None else p.project_namespace_id_to)
        ]
        assert len(owners) == 1, (point, pieces)
        (owner,) = owners
        assert owner.span.low <= point <= owner.span.high
    # An index appears at most once, and the answer is deterministic.
    assert len({p.span.index_id for p in pieces}) == len(pieces)
    assert cover(list(reversed(all_spans))) == pieces


def test_the_lowest_replica_that_covers_alone_wins_over_a_wider_one():
    split = [
        Span(1, replica_id=1, node_id=1, project_namespace_id_to=10),
        Span(2, replica_id=1, node_id=2, project_namespace_id_from=11),
    ]
    whole = [Span(3, replica_id=2, node_id=3)]
    assert [p.span.index_id for p in cover(split + whole)] == [1, 2]
    assert [p.span.index_id for p in cover(whole + split[:1])] == [3]
