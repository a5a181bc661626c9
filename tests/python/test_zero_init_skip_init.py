"""Modules built with torch.nn.utils.skip_init inside zero.Init are partitioned like the others
(issue 55: they were left whole, silently: skip_init builds on the meta device and to_empty()
then gives the module new parameters, which zero.Init did not see)."""
import json

import pytest

torch = pytest.importorskip("torch")

import zspeed  # noqa: E402
from distrun import run_ranks  # noqa: E402

HIDDEN = 10


def _model_source() -> str:
    return f'''
import torch
from torch.nn.utils import skip_init

class Sub(torch.nn.Module):
    def __init__(self, i, o, device=None):
        super().__init__()
        self.linear = torch.nn.Linear(i, o, device=device)
        self.module_list = torch.nn.ModuleList([torch.nn.Linear(i, o, device=device)])

    def forward(self, x):
        return self.module_list[0](self.linear(x))

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = skip_init(torch.nn.Linear, {HIDDEN}, {HIDDEN})
        self.l2 = skip_init(Sub, {HIDDEN}, {HIDDEN})
        self.l3 = torch.nn.Linear({HIDDEN}, {HIDDEN})

    def forward(self, x):
        return self.l3(self.l2(self.l1(x)))
'''


def test_one_process_converts_skip_init_modules_to_the_training_dtype(monkeypatch):
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")
    monkeypatch.setenv("ZSPEED_INIT_DEVICE", "cpu")
    ns: dict = {}
    exec(_model_source(), ns)
    cfg = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    with zspeed.zero.Init(config_dict_or_path=cfg):
        net = ns["Net"]()
    for name, p in net.named_parameters():
        assert p.device.type == "cpu" and hasattr(p, "ds_id"), name  # zero.Init's parameter
        assert p.dtype == torch.bfloat16, (name, p.dtype)  # skip_init's too, in the training dtype
    # to_empty is torch's own again outside the context
    assert "_zspeed_wrapped" not in torch.nn.Module.to_empty.__dict__


WORKER = r'''
import json, os, torch, zspeed
MODEL
a = json.loads(os.environ["ZS_ARGS"])
cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zspeed_summary": False}
with zspeed.zero.Init(config_dict_or_path=cfg):
    net = Net()
parts = {n: [p.numel(), p.ds_tensor.numel() if hasattr(p, "ds_tensor") else None, list(p.ds_shape) if hasattr(p, "ds_shape") else None]
         for n, p in net.named_parameters()}
engine, *_ = zspeed.initialize(model=net, config=cfg)
torch.manual_seed(engine.global_rank)
loss = engine(torch.randn(2, 10)).square().mean()
engine.backward(loss)
engine.step()
json.dump({"parts": parts, "loss": float(loss)}, open(a["out"] + f".{engine.global_rank}.json", "w"))
'''


def test_on_two_ranks_skip_init_parameters_are_partitioned_and_train(tmp_path):
    out = str(tmp_path / "r")
    code = WORKER.replace("MODEL", _model_source())
    res = run_ranks(2, code, env={"ZS_ARGS": json.dumps({"out": out}), "ZSPEED_DEVICE": "cpu"}, timeout=300)
    for r in res:
        assert r.returncode == 0, r
    parts = [json.load(open(f"{out}.{r}.json"))["parts"] for r in range(2)]
    assert set(parts[0]) == {"l1.weight", "l1.bias", "l2.linear.weight", "l2.linear.bias",
                             "l2.module_list.0.weight", "l2.module_list.0.bias", "l3.weight", "l3.bias"}
    for name in parts[0]:
        for rank in range(2):
            numel, shard, shape = parts[rank][name]
            assert numel == 0 and shard is not None, (rank, name, parts[rank][name])  # partitioned
            assert shape == ([HIDDEN, HIDDEN] if name.endswith("weight") else [HIDDEN])
        full = HIDDEN * HIDDEN if name.endswith("weight") else HIDDEN
        assert parts[0][name][1] + parts[1][name][1] >= full  # the two shards hold it all

