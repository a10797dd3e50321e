"""The batched branch: one pass for every gate request a step completes, equal to gating each alone.

The index maps and the grouping are checked by hand on CPU without an engine; the engine tests gate the
same prompts one after another (a branch pass of one) and as one arrival (a pass of many), in bf16."""

from __future__ import annotations

import numpy as np
import torch

from gatehead.evals.workload import synthetic_prompts
from gatehead.runtime.branch import Prefix, Workspace, _Pack


def rows(n: int) -> torch.Tensor:
    return torch.zeros(2, n, 8)


def test_the_pack_keeps_each_requests_queries_on_its_own_keys_causally() -> None:
    pack = _Pack.of([(rows(3), None), (rows(1), None), (rows(2), None)], prefix_keys=True, block_size=4)
    assert pack.positions.tolist() == [0, 1, 2, 0, 0, 1]
    assert pack.request.tolist() == [0, 0, 0, 1, 2, 2] and pack.slot.tolist() == [0, 1, 2, 0, 0, 1]
    assert pack.key_slot.tolist() == pack.slot.tolist() and pack.last.tolist() == [2, 3, 5]
    assert (pack.max_rows, pack.max_keys, pack.prefix_blocks) == (3, 3, None)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    assert torch.equal(pack.mask[0, 0], causal)
    # Padded query rows see their request's keys (their outputs are dropped), never padded keys.
    assert pack.mask[1, 0].tolist() == [[True, False, False]] * 3
    assert pack.mask[2, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert pack.last_mask[:, 0, 0].tolist() == [[True] * 3, [True, False, False], [True, True, False]]
    assert not pack.causal_only  # uneven lengths need the mask; one length alone is plain causality
    assert _Pack.of([(rows(3), None), (rows(3), None)], prefix_keys=True, block_size=4).causal_only


def test_the_pack_maps_suffix_rows_after_their_prefix_and_reads_shared_blocks_once() -> None:
    # Block size 4: request 0 has a 6-position prefix in blocks (7, 2); request 1 a 5-position one in (7, 9).
    requests = [(rows(2), Prefix(6, (7, 2))), (rows(3), Prefix(5, (7, 9)))]
    pack = _Pack.of(requests, prefix_keys=True, block_size=4)
    assert pack.positions.tolist() == [6, 7, 5, 6, 7]
    assert pack.key_slot.tolist() == [6, 7, 5, 6, 7] and pack.max_keys == 8
    assert pack.prefix_blocks.tolist() == [2, 7, 9]  # block 7 read once for both
    # Rows of the blocks read: block b's position p is row index(b) * 4 + p.
    assert pack.prefix_tokens.tolist() == [4, 5, 6, 7, 0, 1] + [4, 5, 6, 7, 8]
    assert pack.prefix_request.tolist() == [0] * 6 + [1] * 5
    assert pack.prefix_slot.tolist() == list(range(6)) + list(range(5))
    assert pack.mask[0, 0].tolist() == [[True] * 7 + [False], [True] * 8, [True] * 8]
    assert pack.mask[1, 0].tolist() == [[True] * 6 + [False] * 2, [True] * 7 + [False], [True] * 8]
    # The negative control attends to the suffix alone, at the same absolute positions.
    blind = _Pack.of(requests, prefix_keys=False, block_size=4)
    assert blind.positions.tolist() == pack.positions.tolist() and blind.prefix_blocks is None
    assert blind.key_slot.tolist() == [0, 1, 0, 1, 2] and blind.max_keys == 3
    assert not _Pack.of([(rows(2), Prefix(6, (7, 2)))], prefix_keys=True, block_size=4).causal_only


def test_a_group_stays_within_one_maximal_request_or_one_step() -> None:
    workspace = Workspace(max_keys=100, max_rows=60)
    requests = [(rows(n), None) for n in (20, 30, 10, 50, 40, 120)]
    groups = [[r.shape[1] for r, _ in group] for group in workspace.groups(requests)]
    # 3 x 30 keys and 60 rows fit; 4 x 50 keys do not; 2 x 50 keys do but 90 rows do not; 120 alone.
    assert groups == [[20, 30, 10], [50], [40], [120]]
    suffix = [(rows(4), Prefix(length, ())) for length in (10, 40, 16)]
    assert [len(g) for g in Workspace(max_keys=100, max_rows=60).groups(suffix)] == [2, 1]  # 2 x 44, 3 x 44


def test_prompt_mode_gates_batched_in_one_pass_equal_each_gated_alone(shared_eager, loop, alone_and_together) -> None:
    prompts = synthetic_prompts(shared_eager.prompts, 16, 7)
    alone, together, per_pass = loop.run(alone_and_together(shared_eager, prompts))
    delta = float(np.abs(alone - together).max())
    print(f"prompt mode: {per_pass:.1f} gate prompts per branch pass; batched vs alone max |dp| {delta:.2e}")
    assert per_pass >= 2, "the gates arrived together: their branch passes must be shared"
    assert delta <= 1e-3
