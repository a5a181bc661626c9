"""Every rank starts from rank 0's weights (runtime/replicate.py): rank 0 holds the
"pretrained" model and rank 1 a different random init; after zspeed.initialize every rank
holds rank 0's parameters and buffers exactly, at every ZeRO stage, and after training
steps every rank holds the same model. Exact comparisons: a broadcast copies bytes."""
import pytest

pytest.importorskip("torch", reason="the runtime needs torch")

from distrun import run_ranks  # noqa: E402

CASES = [
    ("stage 0", {"stage": 0}, "fp32"),
    ("stage 1", {"stage": 1}, "fp32"),
    ("stage 2 offload", {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "bf16"),
    ("stage 3", {"stage": 3}, "fp32"),
    ("stage 3 offload", {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
     "bf16"),
]

SCRIPT = """
import torch, zspeed
zspeed.init_distributed()
r = zspeed.comm.get_rank()
CASES = {cases!r}

def build(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.BatchNorm1d(37), torch.nn.GELU(),
                            torch.nn.Linear(37, 5))
    with torch.no_grad():  # buffers that differ by rank too: running statistics and a counter
        m[1].running_mean.normal_()
        m[1].num_batches_tracked.fill_(seed)
    return m

def whole(engine, model):
    with zspeed.zero.GatheredParameters(list(model.parameters())):
        return {{k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}}

for name, zero, prec in CASES:
    ref = build(100)  # rank 0's model
    dt = torch.bfloat16 if prec == "bf16" else torch.float32
    want = {{k: v.to(dt).float() if v.is_floating_point() else v.float() for k, v in ref.state_dict().items()}}
    model = build(100 + 7 * r)
    cfg = {{"train_micro_batch_size_per_gpu": 4, "zero_optimization": zero,
           "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2}}}}}}
    if prec == "bf16":
        cfg["bf16"] = {{"enabled": True}}
    engine, *_ = zspeed.initialize(model=model, config=cfg)
    got = whole(engine, model)
    bad = [k for k in want if not torch.equal(got[k], want[k])]
    print(name, "START", "ok" if not bad else "differs: " + ",".join(bad))
    g = torch.Generator().manual_seed(5 + r)  # each rank its own data
    for _ in range(2):
        x = torch.randn(4, 13, generator=g).to(engine.device, dt)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    mine = whole(engine, model)
    every = [None, None]
    torch.distributed.all_gather_object(every, mine)
    # parameters agree bit for bit (BatchNorm's running statistics are each rank's own in
    # training mode, as in DeepSpeed and DDP without SyncBatchNorm)
    bad = [k for k, _ in model.named_parameters() if not torch.equal(every[0][k], every[1][k])]
    print(name, "TRAINED", "ok" if not bad else "differs: " + ",".join(bad))
    engine.close()
"""


def test_every_rank_starts_from_rank_0s_weights_at_every_stage(env=None):
    # tests/gpu/check_dp_cuda.py runs this with CUDA models (Gloo and NCCL) through ``env``.
    res = run_ranks(2, SCRIPT.format(cases=CASES), timeout=240, env=env)
    for r in res:
        assert r.returncode == 0, r
    for r in res:
        for name, _, _ in CASES:
            assert f"{name} START ok" in r.stdout, (name, r.stdout)
            assert f"{name} TRAINED ok" in r.stdout, (name, r.stdout)


INIT_THEN_STAGE2 = """
import torch, zspeed
zspeed.init_distributed()
with zspeed.zero.Init():
    model = torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.GELU(), torch.nn.Linear(37, 5))
try:
    zspeed.initialize(model=model, config={"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
                                           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})
    print("ACCEPTED")
except zspeed.ConfigError as e:
    print("ERR", e)
"""


def test_zero_init_shards_with_a_stage_2_engine_are_refused():
    res = run_ranks(2, INIT_THEN_STAGE2, timeout=120)
    for r in res:
        assert r.returncode == 0, r
        assert "ERR the model was built inside zspeed.zero.Init" in r.stdout, r.stdout
        assert "zero_optimization.stage is 2" in r.stdout and "\"stage\": 3" in r.stdout, r.stdout


INFERENCE = """
import torch, zspeed
zspeed.init_distributed()
r = zspeed.comm.get_rank()
torch.manual_seed(100)
ref = torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.GELU(), torch.nn.Linear(37, 5))
torch.manual_seed(100 + 7 * r)
model = torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.GELU(), torch.nn.Linear(37, 5))
eng = zspeed.init_inference(model, config={"dtype": torch.float32, "zero": {"stage": 3,
                                           "offload_param": {"device": "cpu"}}})
x = torch.randn(3, 13, generator=torch.Generator().manual_seed(1))
print("SAME" if torch.equal(eng(x.to(eng.device)).cpu(), ref(x)) else "DIFFERENT")
"""


def test_init_inference_on_ranks_runs_rank_0s_weights():
    res = run_ranks(2, INFERENCE, timeout=120)
    for r in res:
        assert r.returncode == 0, r
        assert "SAME" in r.stdout, r.stdout


PARENT_INIT = """
import torch, zspeed
zspeed.init_distributed()
r = zspeed.comm.get_rank()
orig_apply = torch.nn.Module.apply

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(61, 67)
        self.norm = torch.nn.LayerNorm(67)

class Parent(torch.nn.Module):  # initialises its children after building them, as most models do
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(67, 3)
        self.apply(self._init_weights)

    def forward(self, x):
        return self.head(self.block.lin(x))

    def _init_weights(self, m):
        if isinstance(m, torch.nn.Linear):
            m.weight.data.fill_(1.0)          # through .data
            torch.nn.init.zeros_(m.bias)      # in place
        elif isinstance(m, torch.nn.LayerNorm):
            m.weight.data.normal_()           # random: every rank keeps rank 0's draw

def whole(model):
    from zspeed.runtime.zero.partition_parameters import ZeroParamStatus as S
    with zspeed.zero.GatheredParameters(list(model.parameters())):
        assert all(p.ds_status == S.AVAILABLE for p in model.parameters()), "ds_status inside"
        out = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    assert all(p.ds_status == S.NOT_AVAILABLE for p in model.parameters()), "ds_status after"
    return out

cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
torch.manual_seed(11 + r)  # each rank its own random stream
with zspeed.zero.Init(config_dict_or_path=cfg):
    model = Parent()
    model.block.apply(lambda m: m.bias.data.fill_(2.0) if isinstance(m, torch.nn.LayerNorm) else None)
assert torch.nn.Module.apply is orig_apply, "Module.apply not restored"
assert model.block.lin.weight.numel() == 0 and hasattr(model.block.lin.weight, "ds_tensor"), "not partitioned"
from zspeed.runtime.zero.partition_parameters import ZeroParamStatus
assert model.block.lin.weight.ds_status == ZeroParamStatus.NOT_AVAILABLE and model.head.weight.ds_id >= 0
got = whole(model)
every = [None, None]
torch.distributed.all_gather_object(every, got)
ok = (all(torch.equal(got[k], torch.ones_like(got[k])) for k in ("block.lin.weight", "head.weight"))
      and all(torch.equal(got[k], torch.zeros_like(got[k])) for k in ("block.lin.bias", "head.bias"))
      and torch.equal(got["block.norm.bias"], torch.full_like(got["block.norm.bias"], 2.0))
      and all(torch.equal(every[0][k], every[1][k]) for k in got))
print("INIT", "ok" if ok else f"wrong: {got}")
with zspeed.zero.GatheredParameters([model.head.weight]), torch.no_grad():
    model.head.weight.fill_(5.0)  # no modifier_rank: discarded, with a warning
kept = torch.equal(whole(model)["head.weight"], torch.ones(3, 67))
strict = dict(cfg, zero_optimization={"stage": 3, "enable_sanity_checks": True})
with zspeed.zero.Init(config_dict_or_path=strict):
    lin = torch.nn.Linear(61, 3)
try:
    with zspeed.zero.GatheredParameters([lin.weight]), torch.no_grad():
        lin.weight.fill_(5.0)
    raised = False
except RuntimeError as e:
    raised = "modifier_rank=None" in str(e)
print("DISCARD", "ok" if kept and raised and lin.weight.ds_enable_sanity_checks else f"wrong: {kept} {raised}")
engine, *_ = zspeed.initialize(model=model, config=cfg)
x = torch.ones(2, 61)
loss = engine(x).float().sum()
print("LOSS", float(loss))  # 2 rows of 3 outputs, each 67 * 61 (all weights 1, biases 0): 24522 exactly
engine.close()

zspeed.zero.Init.override_module_apply = False  # DeepSpeed's switch: the parent's fill misses the shards
with zspeed.zero.Init(config_dict_or_path=cfg):
    off = Parent()
print("OFF", "kept" if torch.equal(whole(off)["head.weight"], torch.ones(3, 67)) else "lost")
"""


def test_zero_init_keeps_a_parents_initialisation_of_its_children():
    """DeepSpeed's parent_init case: zero.Init partitions each child when its constructor
    ends; the parent's self.apply(init) afterwards must still reach the whole values (on
    every rank, rank 0's random draws)."""
    res = run_ranks(2, PARENT_INIT, timeout=240)
    for r in res:
        assert r.returncode == 0, r
    for r in res:
        assert "INIT ok" in r.stdout, r.stdout
        assert "LOSS 24522.0" in r.stdout, r.stdout
        assert "DISCARD ok" in r.stdout, r.stdout
        assert "OFF lost" in r.stdout, r.stdout
