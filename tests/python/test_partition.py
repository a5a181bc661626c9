"""The partition plan: every element has exactly one owner, shards are balanced and
aligned, units hold whole parameters, and one rank owns whole parameters."""
import random

import pytest

from zspeed.runtime.partition import PartitionPlan


@pytest.mark.parametrize("ws", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("align,unit", [(1, 7), (4, 100), (256, 1 << 24), (256, 600)])
def test_every_element_has_one_owner(ws, align, unit):
    rng = random.Random(ws * 1000 + align + unit)
    groups = [[rng.choice([0, 1, 3, 17, 255, 256, 257, 1000, 4099]) for _ in range(rng.randint(1, 9))]
              for _ in range(3)]
    for g, numels in enumerate(groups):
        owners = [[] for _ in numels]
        for r in range(ws):
            plan = PartitionPlan(groups, ws, r, align, unit)
            gp = plan.groups[g]
            # units: consecutive whole parameters covering the group, padded and evenly split
            assert sum(u.count for u in gp.units) == len(numels)
            assert sum(u.length for u in gp.units) == gp.total
            for u in gp.units:
                assert u.padded % (ws * align) == 0 and u.padded >= u.length and u.shard * ws == u.padded
                sizes = [n for n in numels[u.first:u.first + u.count] if n]
                assert u.length <= unit or len(sizes) == 1, "only a single large parameter exceeds a unit"
            at = 0
            for pc in plan.pieces(g):
                assert pc.at >= at, "pieces ascend in the local space"
                u = gp.units[pc.unit]
                flat = gp.offsets[pc.param] + pc.offset
                assert u.start + r * u.shard <= flat and flat + pc.length <= u.start + (r + 1) * u.shard
                assert pc.at - gp.local_start[pc.unit] == flat - (u.start + r * u.shard)
                owners[pc.param].extend(range(pc.offset, pc.offset + pc.length))
                at = pc.at + pc.length
            assert at <= gp.local_len
        for pi, n in enumerate(numels):
            assert sorted(owners[pi]) == list(range(n)), f"param {pi} covered exactly once"


def test_one_rank_owns_whole_parameters():
    plan = PartitionPlan([[5, 7, 0, 300]], 1, 0)
    assert [(p.param, p.offset, p.length) for p in plan.pieces(0)] == [(0, 0, 5), (1, 0, 7), (3, 0, 300)]


def test_balanced_within_align():
    plan = PartitionPlan([[10007]], 4, 0, 256)
    owned = [plan.owned(0, r) for r in range(4)]
    assert sum(owned) == 10007 and max(owned) - min(owned) <= 256


def test_bad_rank_is_refused():
    with pytest.raises(ValueError, match="not in a world"):
        PartitionPlan([[3]], 2, 2)
