"""ZeRO-3 leaf modules (deepspeed.utils.set_z3_leaf_modules, python/zspeed/utils/z3_leaf_module.py).

A mixture-of-experts block routes each batch to other experts, so the order in which its
children run changes from one forward to the next. Marked as a leaf, it is gathered whole
(its children carry no fetcher hooks). Training must equal the same model at ZeRO-3 without the
mark bit for bit in one process (the same gradients; an expert no batch routed to gets a zero
gradient at ZeRO-3, as in DeepSpeed's flat partitions, where torch's optimizer at stage 0 would
skip it, so stage 0 is no reference here), and on 2 Gloo ranks the one-process run (tolerance
1e-4 relative / 1e-5 absolute: the ranks' halves of each batch are summed in another order)."""
from __future__ import annotations

import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distrun import run_ranks  # noqa: E402

import zspeed  # noqa: E402
from zspeed.utils import (get_z3_leaf_modules, set_z3_leaf_modules, set_z3_leaf_modules_by_name,  # noqa: E402
                          unset_z3_leaf_modules, z3_leaf_module, z3_leaf_parameter)

DEVICE = os.environ.get("ZSPEED_DEVICE", "cpu")
MOE = r'''
import torch


class Expert(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc, self.out = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return self.out(torch.relu(self.fc(x)))


class SparseMoeBlock(torch.nn.Module):
    """Top-1 routing over 4 experts: which experts run depends on the batch."""

    def __init__(self, d, n=4):
        super().__init__()
        self.gate = torch.nn.Linear(d, n)
        self.experts = torch.nn.ModuleList(Expert(d) for _ in range(n))

    def forward(self, x):
        choice = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, e in enumerate(self.experts):
            sel = choice == i
            if bool(sel.any()):
                out[sel] = e(x[sel]) * torch.sigmoid(self.gate(x[sel])[:, i:i + 1])
        return x + out


class Net(torch.nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.inp = torch.nn.Linear(7, d)
        self.moe1, self.moe2 = SparseMoeBlock(d), SparseMoeBlock(d)
        self.head = torch.nn.Linear(d, 3)

    def forward(self, x):
        return self.head(self.moe2(self.moe1(self.inp(x))))


def data(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 7, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(n)]


def config(stage, ws=1):
    return {"train_micro_batch_size_per_gpu": 6 // ws, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zspeed_summary": False,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}


def train(stage, leaf, steps=5, rank=0, ws=1):
    from zspeed.utils import set_z3_leaf_modules
    torch.manual_seed(0)
    net = Net()
    if leaf:
        set_z3_leaf_modules(net, [SparseMoeBlock])
    e, *_ = zspeed.initialize(model=net, config=config(stage, ws))
    for x, y in data(steps):
        x, y = x[rank::ws], y[rank::ws]
        loss = torch.nn.functional.cross_entropy(e(x.to(e.device)).float(), y.to(e.device))
        e.backward(loss)
        e.step()
    with zspeed.zero.GatheredParameters(list(e.module.parameters())):
        return e, {k: v.detach().float().cpu().clone() for k, v in e.module.state_dict().items()}
'''
exec(compile(MOE, "moe_case", "exec"))  # noqa: S102 - the same source as the ranks run


def test_marking_by_class_name_and_module_name():
    net = Net()  # noqa: F821 - defined by MOE
    got = set_z3_leaf_modules(net, [SparseMoeBlock])  # noqa: F821
    assert got == [net.moe1, net.moe2] and get_z3_leaf_modules(net) == got
    assert z3_leaf_module(net.moe1) and not z3_leaf_module(net.inp)
    assert unset_z3_leaf_modules(net, ["SparseMoeBlock"]) == got and get_z3_leaf_modules(net) == []
    qual = f"{SparseMoeBlock.__module__}.{SparseMoeBlock.__qualname__}"  # noqa: F821
    assert set_z3_leaf_modules(net, [qual]) == got
    found, missing = set_z3_leaf_modules_by_name(net, ["moe1", "nope"], flag=False, raise_if_not_found=False)
    assert found == [net.moe1] and missing == ["nope"] and get_z3_leaf_modules(net) == [net.moe2]
    with pytest.raises(ValueError, match="no module of Conv2d in the model"):
        set_z3_leaf_modules(net, [torch.nn.Conv2d])
    assert set_z3_leaf_modules(net, [torch.nn.Conv2d], raise_if_not_found=False) == []
    with pytest.raises(ValueError, match="list of module classes or class names"):
        set_z3_leaf_modules(net, [3])
    with pytest.raises(ValueError, match="no module named 'nope'"):
        set_z3_leaf_modules_by_name(net, ["nope"])


def test_a_leaf_is_gathered_whole_and_trains_as_without_the_mark():
    _, want = train(3, leaf=False)  # noqa: F821
    e, got = train(3, leaf=True)  # noqa: F821
    for k in want:
        assert torch.equal(got[k], want[k]), k
    _, start = train(3, leaf=False, steps=0)  # noqa: F821
    assert any(not torch.equal(start[k], want[k]) for k in want)  # it trained
    # The experts carry no fetcher hooks: the leaf's hooks gather them.
    fetcher = e._fetcher
    hooked = {id(m) for m in e.module.modules() if any(
        getattr(h, "__self__", None) is fetcher for h in m._forward_pre_hooks.values())}
    assert id(e.module.moe1) in hooked and id(e.module.moe1.experts[0]) not in hooked
    assert all(z3_leaf_parameter(p) for p in e.module.moe1.parameters())
    assert not z3_leaf_parameter(e.module.inp.weight)
    # Outside a forward the leaf's parameters are released again (shards only).
    assert all(p.numel() == 0 for p in e.module.moe1.parameters())
    # The memory estimate counts a leaf's subtree at once.
    from zspeed.runtime.memory import deepest_path_elems
    assert deepest_path_elems(e.module, lambda p: p.ds_numel if hasattr(p, "ds_numel") else p.numel()) >= sum(
        p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in e.module.moe1.parameters())


@pytest.mark.skipif(DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
def test_leaves_on_two_ranks():
    code = MOE + r'''
import json
import zspeed
import torch.distributed as dist
zspeed.comm.init_distributed("gloo")
rank, ws = dist.get_rank(), dist.get_world_size()
_, st = train(3, leaf=True, rank=rank, ws=ws)
print("RESULT", json.dumps({k: v.flatten().tolist() for k, v in st.items()}))
'''
    import json
    outs = run_ranks(2, code)
    _, want = train(3, leaf=True)  # noqa: F821 - one process, the whole batch
    for o in outs:
        assert o.returncode == 0, o.stderr[-3000:]
        line = next(x for x in o.stdout.splitlines() if x.startswith("RESULT "))
        got = json.loads(line[len("RESULT "):])
        for k, v in want.items():
            torch.testing.assert_close(torch.tensor(got[k]), v.flatten(), rtol=1e-4, atol=1e-5)


def test_marking_by_name_suffix():
    from zspeed.utils import set_z3_leaf_modules_by_suffix
    net = Net()  # noqa: F821 - defined by MOE
    found, missing = set_z3_leaf_modules_by_suffix(net, ["moe1", "oe2", "e1", "nope"], raise_if_not_found=False)
    assert found == [net.moe1, net.moe2] and missing == ["nope"]  # moe1 matched twice, listed once
    assert get_z3_leaf_modules(net) == [net.moe1, net.moe2]
    found, _ = set_z3_leaf_modules_by_suffix(net, ["moe2"], flag=False)
    assert found == [net.moe2] and get_z3_leaf_modules(net) == [net.moe1]
    with pytest.raises(ValueError, match="no module name ends with 'nope'"):
        set_z3_leaf_modules_by_suffix(net, ["nope"])


def _trained_state(e) -> dict:
    """The engine trained on train()'s 5 batches: its whole state, in fp32 on the CPU."""
    for x, y in data(5):  # noqa: F821
        loss = torch.nn.functional.cross_entropy(e(x.to(e.device)).float(), y.to(e.device))
        e.backward(loss)
        e.step()
    with zspeed.zero.GatheredParameters(list(e.module.parameters())):
        return {k: v.detach().float().cpu() for k, v in e.module.state_dict().items()}


def test_the_leaf_module_config_section_marks_leaves_as_deepspeeds(caplog):
    """zero_optimization.leaf_module (DeepSpeed's): classes by qualified name, names and name
    suffixes mark leaves at initialize (a string is a list of one); DeepSpeed's default classes
    (transformers' MoE blocks) match nothing here silently; custom entries matching nothing warn;
    and the config's marks train as set_z3_leaf_modules's (bit for bit)."""
    import logging
    from zspeed.runtime.config import ConfigError
    from zspeed.runtime.zero.config import DeepSpeedZeroConfig
    from zspeed.runtime.zero.leaf_module_config import DEFAULT_LEAF_MODULE_CLASSES
    assert DeepSpeedZeroConfig().leaf_module.classes == DEFAULT_LEAF_MODULE_CLASSES
    assert DeepSpeedZeroConfig(leaf_module={"names": "a", "name_suffixes": ["b", "b"]}).leaf_module.name_suffixes == ["b"]
    # (DeepSpeed's config classes raise pydantic's ValidationError where it is installed: a ValueError)
    with pytest.raises(ValueError, match="leaf_module.names.*list of strings"):
        DeepSpeedZeroConfig(leaf_module={"names": [3]})
    with pytest.raises(ValueError, match="unknown config key 'class'"):
        DeepSpeedZeroConfig(leaf_module={"class": ["X"]})

    _, want = train(3, leaf=True)  # noqa: F821 - set_z3_leaf_modules(net, [SparseMoeBlock])
    qual = f"{SparseMoeBlock.__module__}.{SparseMoeBlock.__qualname__}"  # noqa: F821
    for section in ({"classes": qual}, {"names": ["moe1"], "name_suffixes": "moe2"}):
        torch.manual_seed(0)
        net = Net()  # noqa: F821
        cfg = config(3)  # noqa: F821
        cfg["zero_optimization"]["leaf_module"] = section
        e, *_ = zspeed.initialize(model=net, config=cfg)
        assert get_z3_leaf_modules(net) == [net.moe1, net.moe2], section
        got = _trained_state(e)
        for k in want:
            assert torch.equal(got[k], want[k]), (section, k)
    cfg = config(3)  # noqa: F821
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        zspeed.initialize(model=Net(), config=cfg)  # noqa: F821 - the defaults: no warning
        assert not [r for r in caplog.records if "leaf_module" in r.getMessage()]
        cfg["zero_optimization"]["leaf_module"] = {"names": ["nope"]}
        zspeed.initialize(model=Net(), config=cfg)  # noqa: F821
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "unknown module names: ['nope']" in text and "matched no module" in text


def test_stage3_module_granularity_threshold_marks_fine_grained_modules_as_leaves(caplog):
    """DeepSpeed's rule: granularity = a subtree's parameters // its modules with parameters
    (containers not counted, never leaves); from the root down, the first module at or under the
    threshold is a leaf. Net: 5135 parameters over 31 such modules -> 165; each SparseMoeBlock
    2500 over 14 (itself, the gate, 4 experts of 3) -> 178; each Expert 612 over 3 -> 204."""
    import logging
    from zspeed.utils.z3_leaf_module import set_z3_leaf_modules_by_granularity
    net = Net()  # noqa: F821
    assert set_z3_leaf_modules_by_granularity(net, 0) == [] and set_z3_leaf_modules_by_granularity(net, 164) == []
    assert set_z3_leaf_modules_by_granularity(net, 165) == [net]  # the root first
    net = Net()  # noqa: F821
    parts = torch.nn.ModuleList([net.moe1, net.moe2])
    assert set_z3_leaf_modules_by_granularity(parts, 180) == [net.moe1, net.moe2]  # a container: its children
    net = Net()  # noqa: F821
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        assert set_z3_leaf_modules_by_granularity(net.moe1, 100) == []
    assert "smallest granularity is 178 (SparseMoeBlock)" in caplog.text
    # Through the config: the whole Net is one leaf, and trains as with the blocks marked.
    _, want = train(3, leaf=True)  # noqa: F821
    torch.manual_seed(0)
    net = Net()  # noqa: F821
    cfg = config(3)  # noqa: F821
    cfg["zero_optimization"]["stage3_module_granularity_threshold"] = 170
    e, *_ = zspeed.initialize(model=net, config=cfg)
    assert get_z3_leaf_modules(net) == [net]
    got = _trained_state(e)
    for k in want:
        assert torch.equal(got[k], want[k]), k
