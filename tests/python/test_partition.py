"""The partition plan: every element has exactly one owner, slices are balanced and
aligned, and one rank owns whole parameters."""
import random

import pytest

from zspeed.runtime.partition import PartitionPlan


@pytest.mark.parametrize("ws", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("align", [1, 4, 256])
def test_every_element_has_one_owner(ws, align):
    rng = random.Random(ws * 1000 + align)
    groups = [[rng.choice([0, 1, 3, 17, 255, 256, 257, 1000, 4099]) for _ in range(rng.randint(1, 9))]
              for _ in range(3)]
    for g, numels in enumerate(groups):
        owners = [[] for n in numels]
        for r in range(ws):
            plan = PartitionPlan(groups, ws, r, align)
            gp = plan.groups[g]
            assert gp.padded % (ws * align) == 0 and gp.padded >= gp.total
            assert gp.slice_len * ws == gp.padded and gp.slice_len % align == 0
            at = 0
            for pc in plan.pieces(g):
                assert pc.at == at, "pieces are contiguous in the slice"
                owners[pc.param].extend(range(pc.offset, pc.offset + pc.length))
                for i in range(pc.offset, pc.offset + pc.length):
                    assert gp.owner(gp.offsets[pc.param] + i) == r
                at += pc.length
            assert at == plan.owned(g) <= gp.slice_len
        for pi, n in enumerate(numels):
            assert sorted(owners[pi]) == list(range(n)), f"param {pi} covered exactly once"


def test_one_rank_owns_whole_parameters():
    plan = PartitionPlan([[5, 7, 0, 300]], 1, 0)
    assert [(p.param, p.offset, p.length) for p in plan.pieces(0)] == [(0, 0, 5), (1, 0, 7), (3, 0, 300)]


def test_balanced_within_align():
    plan = PartitionPlan([[10007]], 4, 0, 256)
    owned = [plan.owned(0, r) for r in range(4)]
    assert sum(owned) == 10007 and max(owned) - min(owned) <= 256 * 4


def test_bad_rank_is_refused():
    with pytest.raises(ValueError, match="not in a world"):
        PartitionPlan([[3]], 2, 2)
