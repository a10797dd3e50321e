"""RowKeeper: gate rows kept across chunked-prefill steps, driven on CPU without an engine."""

from __future__ import annotations

import torch

from gatehead.runtime.gated import GateRow, RowKeeper

SUFFIX = (7,)
HIDDEN = 4


def step(keeper: RowKeeper, rows: list[GateRow], live: set[str] | None = None):
    """Run one step: the tap buffer holds each token's global position in every column (hidden), negated (residual)."""
    total = max((r.end for r in rows), default=0)
    buffer = torch.zeros(2, total, HIDDEN)
    for r in rows:
        buffer[0, r.start:r.end] = torch.arange(r.done, r.done + r.end - r.start, dtype=torch.float)[:, None]
    buffer[1] = -buffer[0]
    keeper.begin_step(rows, live if live is not None else {r.req_id for r in rows} | set(keeper.kept))
    return [(r.batch_row, kept) for r, kept in keeper.collect(buffer)]


def row(req: str, batch_row: int, start: int, n: int, done: int, prompt_len: int, tail=SUFFIX,
        suffix: int = 0) -> GateRow:
    """A gate's share of a step; `suffix` > 0: a suffix-mode gate whose last `suffix` tokens are its suffix."""
    return GateRow(req, batch_row, start, start + n, done, prompt_len, tail, prompt_len - suffix if suffix else 0)


def positions(rows: torch.Tensor) -> list[int]:
    """The global positions of a prompt's kept rows [2, L, hidden], checking each residual row is its hidden row's."""
    assert torch.equal(rows[1], -rows[0])
    return rows[0, :, 0].int().tolist()


def test_a_prompt_split_over_three_steps_comes_out_whole_and_in_order() -> None:
    keeper = RowKeeper(SUFFIX, max_rows=100)
    assert step(keeper, [row("a", 1, 5, 4, 0, 10)]) == []
    assert step(keeper, [row("a", 0, 0, 4, 4, 10)]) == []
    [(batch_row, rows)] = step(keeper, [row("a", 2, 3, 2, 8, 10)])
    assert batch_row == 2 and positions(rows) == list(range(10))
    assert keeper.kept == {} and keeper.rows_kept() == 0


def test_two_gates_in_one_step_do_not_mix() -> None:
    keeper = RowKeeper(SUFFIX, max_rows=100)
    done = step(keeper, [row("a", 0, 0, 3, 0, 3), row("b", 3, 10, 5, 0, 5)])
    assert [(b, positions(r)) for b, r in done] == [(0, [0, 1, 2]), (3, [0, 1, 2, 3, 4])]


def test_preempted_prompt_restarts_from_its_first_token() -> None:
    keeper = RowKeeper(SUFFIX, max_rows=100)
    step(keeper, [row("a", 0, 0, 4, 0, 8)])
    step(keeper, [], live=set())  # preempted: vLLM dropped it from the batch
    assert keeper.kept == {}
    assert step(keeper, [row("a", 0, 0, 4, 0, 8)]) == []  # recomputed from scratch
    [(_, rows)] = step(keeper, [row("a", 0, 0, 4, 4, 8)])
    assert positions(rows) == list(range(8))


def test_rows_missing_from_a_prefix_hit_or_a_resume_fail_the_request() -> None:
    keeper = RowKeeper(SUFFIX, max_rows=100)
    assert step(keeper, [row("hit", 0, 0, 4, 32, 36)]) == [(0, None)]  # first seen at done=32
    step(keeper, [row("b", 0, 0, 4, 0, 12)])
    assert step(keeper, [row("b", 0, 0, 4, 8, 12)]) == [(0, None)]  # resumed after 8, only 4 kept


def test_a_prompt_not_ending_with_the_suffix_fails() -> None:
    keeper = RowKeeper(SUFFIX, max_rows=100)
    assert step(keeper, [row("a", 0, 0, 3, 0, 3, tail=(9,))]) == [(0, None)]


def test_aborted_requests_free_their_rows() -> None:
    keeper = RowKeeper(SUFFIX, max_rows=100)
    step(keeper, [row("a", 0, 0, 6, 0, 20)])
    assert keeper.rows_kept() == 6
    step(keeper, [row("b", 0, 0, 2, 0, 2)], live={"b"})
    assert keeper.rows_kept() == 0


def test_rows_beyond_the_bound_fail_instead_of_growing() -> None:
    keeper = RowKeeper(SUFFIX, max_rows=8)
    assert step(keeper, [row("long", 0, 0, 4, 0, 9)]) == [] and keeper.kept == {}
    step(keeper, [row("a", 0, 0, 6, 0, 8)])
    assert step(keeper, [row("b", 1, 6, 4, 0, 8)], live={"a", "b"}) == []
    assert "b" in keeper.failed and keeper.rows_kept() == 6


def test_a_prompt_completing_in_the_step_does_not_count_against_the_bound() -> None:
    # Chunked prefill: "a" finishes (2 rows) while "b" starts with 7 of its 8 rows; 6 + 2 + 7 > 8,
    # but after the step only b's 7 rows stay kept. (Found as concurrent long gate prompts failing.)
    keeper = RowKeeper(SUFFIX, max_rows=8)
    assert step(keeper, [row("a", 0, 0, 6, 0, 8)]) == []
    [(_, rows)] = step(keeper, [row("a", 0, 0, 2, 6, 8), row("b", 1, 2, 7, 0, 8)])
    assert positions(rows) == list(range(8)) and "b" not in keeper.failed and keeper.rows_kept() == 7
    [(_, rows)] = step(keeper, [row("b", 0, 0, 1, 7, 8)])
    assert positions(rows) == list(range(8)) and keeper.rows_kept() == 0


SUFFIX3 = (7, 7, 7)


def test_a_suffix_mode_gate_keeps_only_its_suffix_rows_across_a_chunk_boundary() -> None:
    keeper = RowKeeper(SUFFIX3, max_rows=100, suffix_mode=True)
    assert step(keeper, [row("a", 0, 0, 4, 0, 10, SUFFIX3, suffix=3)]) == [] and keeper.rows_kept() == 0
    assert step(keeper, [row("a", 0, 0, 4, 4, 10, SUFFIX3, suffix=3)]) == [] and keeper.rows_kept() == 1
    [(batch_row, rows)] = step(keeper, [row("a", 1, 2, 2, 8, 10, SUFFIX3, suffix=3)])
    assert batch_row == 1 and positions(rows) == [7, 8, 9] and keeper.rows_kept() == 0


def test_a_suffix_mode_gate_may_start_at_its_suffix_but_not_inside_it() -> None:
    keeper = RowKeeper(SUFFIX3, max_rows=100, suffix_mode=True)
    # A prefix-cache hit of 32 tokens, the suffix at 32..34: every suffix row is computed.
    [(_, rows)] = step(keeper, [row("hit", 0, 0, 3, 32, 35, SUFFIX3, suffix=3)])
    assert positions(rows) == [32, 33, 34]
    # A hit reaching into the suffix (the scheduler never allows it): the missing row fails the gate.
    assert step(keeper, [row("deep", 0, 0, 2, 33, 35, SUFFIX3, suffix=3)]) == [(0, None)]


def test_a_preempted_suffix_mode_gate_starts_over_from_a_cached_prefix() -> None:
    keeper = RowKeeper(SUFFIX3, max_rows=100, suffix_mode=True)
    step(keeper, [row("a", 0, 0, 9, 0, 10, SUFFIX3, suffix=3)])
    assert keeper.rows_kept() == 2
    # Preempted, then rescheduled from a 7-token cached prefix (the vLLM scheduler caps the hit there).
    [(_, rows)] = step(keeper, [row("a", 0, 0, 3, 7, 10, SUFFIX3, suffix=3)])
    assert positions(rows) == [7, 8, 9]


def test_a_gate_prefill_that_starts_over_is_counted() -> None:
    keeper = RowKeeper(SUFFIX3, max_rows=100, suffix_mode=True)
    step(keeper, [row("a", 0, 0, 4, 0, 10, SUFFIX3, suffix=3)])
    step(keeper, [row("b", 0, 0, 4, 4, 10, SUFFIX3, suffix=3)])  # first seen after a cache hit: no restart
    assert keeper.restarts == 0
    step(keeper, [row("a", 0, 0, 4, 0, 10, SUFFIX3, suffix=3)])  # preempted, recomputed from the start
    assert keeper.restarts == 1
