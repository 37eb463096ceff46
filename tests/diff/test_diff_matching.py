"""Lining runs up: ranks, groups, steps and collectives, and runs that differ in shape, said."""

from __future__ import annotations

import polars as pl
from diff_helpers import drop_ranks, synth

from tracekit.diff import diff_runs
from tracekit.diff.matching import match_groups, match_ranks


def _ranks(rows: list[tuple[int, str, int]], world: int) -> pl.DataFrame:
    return pl.DataFrame({"rank": [r for r, _, _ in rows], "world_size": [world] * len(rows),
                         "host": [h for _, h, _ in rows], "local_device": [d for _, _, d in rows]})


def test_ranks_by_number_when_the_world_is_the_same():
    a = _ranks([(0, "h0", 0), (1, "h0", 1)], 2)
    b = _ranks([(0, "x0", 0), (1, "x0", 1)], 2)
    assert match_ranks(a, b) == ("rank", {0: 0, 1: 1}, [])


def test_ranks_by_host_and_device_when_world_sizes_differ():
    a = _ranks([(0, "h0", 0), (1, "h0", 1), (2, "h1", 0), (3, "h1", 1)], 4)
    b = _ranks([(0, "h1", 0), (1, "h1", 1)], 2)
    how, mapping, notes = match_ranks(a, b)
    assert how == "host_device" and mapping == {2: 0, 3: 1}
    assert "world sizes differ: A 4 ranks, B 2" in notes


def test_missing_ranks_are_said():
    a = _ranks([(0, "h0", 0), (2, "h0", 2)], 4)
    _how, mapping, notes = match_ranks(a, a)
    assert mapping == {0: 0, 2: 2}
    assert notes == ["A has 2 of its 4 ranks (missing: 1,3)", "B has 2 of its 4 ranks (missing: 1,3)"]


def test_groups_by_membership_and_desc_then_membership_then_desc():
    ga = pl.DataFrame({"group": ["1", "2", "3"], "desc": ["dp", "ep", "tp"], "ranks": [[0, 1], [2, 3], [0, 2]]})
    gb = pl.DataFrame({"group": ["9", "8", "7"], "desc": ["dp", "moe", "tp"], "ranks": [[0, 1], [2, 3], [5, 6]]})
    pairs, notes = match_groups(ga, gb, {0: 0, 1: 1, 2: 2, 3: 3})
    assert [(p.group_a, p.group_b, p.by) for p in pairs] == [("1", "9", "membership+desc"), ("2", "8", "membership"),
                                                            ("3", "7", "desc")]
    assert notes == []


def test_groups_follow_the_rank_mapping():
    ga = pl.DataFrame({"group": ["a"], "desc": [None], "ranks": [[2, 3]]})
    gb = pl.DataFrame({"group": ["b"], "desc": [None], "ranks": [[0, 1]]})
    pairs, _ = match_groups(ga, gb, {2: 0, 3: 1})
    assert [(p.group_a, p.group_b) for p in pairs] == [("a", "b")]
    pairs, notes = match_groups(ga, gb, {2: 2, 3: 3})
    assert pairs == [] and notes == ["1 group(s) of A have no match in B: a",
                                     "1 group(s) of B have no match in A: b"]


def test_different_world_sizes_are_said_and_matched_where_possible(base):
    d = diff_runs(base, synth(hosts=2))
    m = d.matching
    assert m.ranks_by == "host_device" and len(m.ranks) == 8
    assert "world sizes differ: A 16 ranks, B 8" in m.notes
    assert "caution: world sizes differ: A 16 ranks, B 8" in d.verdict
    assert any(s.item == "world size" and (s.a, s.b) == ("16", "8") for s in d.setup)


def test_missing_ranks_in_b_are_said(base, base_tables):
    d = diff_runs(base, drop_ranks(base_tables, {3}))
    assert "B has 15 of its 16 ranks (missing: 3)" in d.matching.notes
    assert d.matching.ranks_only_a == [3] and 3 not in d.matching.ranks
    assert "caution: B has 15 of its 16 ranks (missing: 3)" in d.verdict


def test_different_step_counts_compare_the_common_steps(base):
    d = diff_runs(base, synth(steps=3))
    assert d.matching.steps == [0, 1, 2] and d.decomposition.steps == 3
    assert "steps differ: A has 0-4, B 0-2; compared 0-2" in d.matching.notes
    assert "caution: steps differ: A has 0-4, B 0-2" in d.verdict


def test_instances_by_position_when_sequences_differ(base):
    d = diff_runs(base, synth(dp_buckets=3))
    m = d.matching
    assert m.instances_by_position > 0 and m.instances_by_seq > 0
    assert m.instances_by_seq + m.instances_by_position + m.instances_only_a == 820


def test_groups_by_id_and_size_last():
    ga = pl.DataFrame({"group": ["0", "1"], "desc": [None, None], "ranks": [[0, 1], [2, 3]]})
    gb = pl.DataFrame({"group": ["0", "1"], "desc": [None, None], "ranks": [[4, 5], [6, 7, 8]]})
    pairs, notes = match_groups(ga, gb, {0: 0, 1: 1, 2: 2, 3: 3})
    assert [(p.group_a, p.group_b, p.by) for p in pairs] == [("0", "0", "id")]
    assert notes == ["1 group(s) of A have no match in B: 1", "1 group(s) of B have no match in A: 1"]


def test_steps_without_a_number_in_common_are_matched_in_order(base, base_tables):
    from diff_helpers import shift_steps

    d = diff_runs(base, shift_steps(base_tables, 10))
    assert d.matching.steps == [0, 1, 2, 3, 4] and d.decomposition.steps == 5
    assert d.matching.notes[0].startswith("no step number in common (A 0-4, B 10-14): steps matched in order, "
                                          "B 10 -> A 0")
    assert d.verdict.startswith("no significant change: step +0 ns"), d.verdict
    assert "caution: no step number in common" in d.verdict
    assert not any(b.flagged for b in d.buckets) and d.matching.instances_by_seq == 820
