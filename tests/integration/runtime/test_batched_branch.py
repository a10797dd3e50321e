"""The batched branch: one pass for every gate request a step completes, equal to gating each alone.

The index maps and the grouping are checked by hand on CPU without an engine; the engine tests gate the
same prompts one after another (a branch pass of one) and as one arrival (a pass of many), in bf16."""

from __future__ import annotations

import numpy as np
import torch

from gatehead.evals.workload import synthetic_prompts, synthetic_requests
from gatehead.runtime.branch import Prefix, Workspace, _Pack


def rows(n: int) -> torch.Tensor:
    return torch.zeros(2, n, 8)


def test_the_pack_keeps_each_requests_queries_on_its_own_keys_causally() -> None:
    pack = _Pack.of([(rows(3), None), (rows(1), None), (rows(2), None)], prefix_keys=True, block_size=4)
    assert pack.positions.tolist() == [0, 1, 2, 0, 0, 1]
    assert pack.request.tolist() == [0, 0, 0, 1, 2, 2] and pack.slot.tolist() == [0, 1, 2, 0, 0, 1]
    assert pack.key_slot.tolist() == pack.slot.tolist() and pack.last.tolist() == [2, 3, 5]
    assert (pack.max_rows, pack.max_keys, pack.prefix_blocks) == (3, 3, None)
    # One shape per length, unpadded; without prefix keys plain causality needs no mask.
    assert [(sh.rows, sh.cached, sh.members.tolist(), sh.mask) for sh in pack.shapes] == \
        [(3, 0, [0], None), (1, 0, [1], None), (2, 0, [2], None)]
    alike = _Pack.of([(rows(3), None), (rows(2), None), (rows(3), None)], prefix_keys=True, block_size=4)
    assert [(sh.rows, sh.members.tolist()) for sh in alike.shapes] == [(3, [0, 2]), (2, [1])]


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
    # Each shape's queries see the prefix keys and, causally, their own; one mask per shape, unpadded.
    first, second = pack.shapes
    assert (first.rows, first.cached, first.members.tolist()) == (2, 6, [0])
    assert first.mask.tolist() == [[True] * 7 + [False], [True] * 8]
    assert (second.rows, second.cached, second.members.tolist()) == (3, 5, [1])
    assert second.mask.tolist() == [[True] * 6 + [False] * 2, [True] * 7 + [False], [True] * 8]
    # The negative control attends to the suffix alone, at the same absolute positions.
    blind = _Pack.of(requests, prefix_keys=False, block_size=4)
    assert blind.positions.tolist() == pack.positions.tolist() and blind.prefix_blocks is None
    assert blind.key_slot.tolist() == [0, 1, 0, 1, 2] and blind.max_keys == 3
    assert [(sh.rows, sh.cached, sh.mask) for sh in blind.shapes] == [(2, 0, None), (3, 0, None)]


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


def test_gates_of_uneven_lengths_equal_each_gated_alone_in_any_company(shared_eager, loop,
                                                                       alone_and_together) -> None:
    """Prompts of one to several hundred tokens, in three different groupings: a pass's result must not hang on which
    other requests share it (which ones do depends on arrival timing)."""
    prompts = [shared_eager.prompts.build(r.question, r.passages, r.conversation).gate
               for r in synthetic_requests(6, 21, max_passages=0) + synthetic_requests(6, 22, max_passages=8)]
    lengths = sorted(len(p) for p in prompts)
    assert lengths[-1] >= 2 * lengths[0], lengths
    alone, together, per_pass = loop.run(alone_and_together(shared_eager, prompts))
    backwards = loop.run(alone_and_together(shared_eager, prompts[::-1]))[1][::-1]
    halves = np.concatenate([loop.run(alone_and_together(shared_eager, prompts[i::2]))[1] for i in (0, 1)])
    halves = halves[np.argsort([*range(0, 12, 2), *range(1, 12, 2)])]
    deltas = [float(np.abs(alone - other).max()) for other in (together, backwards, halves)]
    print(f"uneven lengths {lengths[0]}-{lengths[-1]}: {per_pass:.1f} gate prompts per branch pass; "
          f"batched vs alone max |dp| {max(deltas):.2e} (all, reversed, halves: {deltas})")
    assert per_pass >= 2, "the gates arrived together: their branch passes must be shared"
    # Issue 26 allows 1e-3 between batched and alone; the branch claims more, that company changes nothing:
    # one bf16 rounding moved by the padding shows as ~1e-4 here (padded attention measured 1.7e-4).
    assert max(deltas) <= 1e-6
