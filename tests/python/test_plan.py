"""The run plan's table of combinations (runtime/plan.py): every refusal of a combination
comes from a row, through zspeed.initialize, and docs/CONFIG.md renders the same rows."""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="the runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError  # noqa: E402
from zspeed.runtime.plan import FEATURES, RunPlan, combinations_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _zero(**z):
    return eh.config(zero_optimization=z)


CASES = [  # (config, client optimizer?, the row's key, what the refusal says)
    (_zero(stage=0, offload_optimizer={"device": "cpu"}), False, "offload_optimizer.device",
     "needs zero_optimization.stage 1, 2 or 3"),
    (_zero(stage=2, offload_optimizer={"device": "none", "delayed_update": True}), False, "delayed_update",
     "needs offload_optimizer.device \"cpu\""),
    (_zero(stage=2, offload_optimizer={"device": "cpu", "overlap_forward": True, "delayed_update": True}), False,
     "overlap_forward", "and delayed_update cannot be combined"),
    (_zero(stage=3, offload_optimizer={"device": "none", "overlap_forward": True}), False, "overlap_forward",
     "needs offload_optimizer.device \"cpu\""),
    (_zero(stage=3, offload_optimizer={"device": "cpu", "ratio": 0.5, "delayed_update": True}), False, "ratio",
     "and delayed_update cannot be combined"),
    (_zero(stage=2, offload_optimizer={"device": "cpu", "ratio": 0.5}), True, "ratio",
     "not from another optimizer object"),
]


@pytest.mark.parametrize("cfg,client,key,says", CASES)
def test_each_refusal_is_a_row_of_the_table(cfg, client, key, says):
    m = eh.mlp()
    opt = torch.optim.AdamW(m.parameters()) if client else None
    if client:
        del cfg["optimizer"]
    with pytest.raises(ConfigError) as ei:
        zspeed.initialize(model=m, optimizer=opt, config=cfg)
    msg = str(ei.value)
    assert key in msg and says in msg, msg
    rows = [f for f in FEATURES if f.key.endswith(key) or key in f.key]
    assert any(r.says in msg for f in rows for r in f.requires), msg  # the message is a row's


def test_the_optimizer_of_a_split_must_be_adam():
    c = _zero(stage=2, offload_optimizer={"device": "cpu", "ratio": 0.5})
    c["optimizer"] = {"type": "Lion", "params": {"lr": 1e-3}}
    with pytest.raises(ConfigError, match="Use Adam or AdamW, or ratio 1"):
        zspeed.initialize(model=eh.mlp(), config=c)


def test_the_docs_table_is_the_rows():
    table = combinations_table()
    for f in FEATURES:
        assert f"`{f.key}`" in table
    with open(os.path.join(ROOT, "docs", "CONFIG.md")) as fh:
        assert table in fh.read()


def test_the_plan_of_an_engine():
    e, *_ = zspeed.initialize(model=eh.mlp(), config=_zero(stage=2, offload_optimizer={"device": "cpu"}))
    p = e.plan
    assert isinstance(p, RunPlan)
    # an offloaded optimizer steps a store's local space on one rank too (shard degree 1)
    assert (p.stage, p.store, p.optimizer, p.timing, p.comm) == (2, "sharded", "host", "sync", "none")
    assert (p.shard_degree, p.unit_elems) == (1, 1)
    e, *_ = zspeed.initialize(model=eh.mlp(), config=_zero(stage=2))
    assert (e.plan.store, e.plan.optimizer) == ("replicated", "device")
    with pytest.raises(Exception):
        p.stage = 3  # frozen
