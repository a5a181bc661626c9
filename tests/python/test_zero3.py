"""ZeRO stage 3 (runtime/zero3.py): partitioned parameters, gathered around the modules that
use them, against ZeRO-2 (every parameter whole) on the same data.

Tolerance: the runs differ only in where the optimizer's arithmetic runs (the stage-3 local
space is stepped as one flat tensor with padding, ZeRO-2's per parameter), so fp32 results
agree to rounding: 1e-5 relative after 4 AdamW steps at lr 1e-2. bf16/fp16 runs round the
same fp32 updates to the same 16-bit weights and agree exactly or to one 16-bit ulp (2e-2).

ZSPEED_DEVICE=cuda runs the single-process cases on a GPU (tests/gpu/check_zero3_cuda.py)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distrun import run_ranks  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError  # noqa: E402
from zspeed.runtime.engine import EngineClosedError  # noqa: E402

DEVICE = os.environ.get("ZSPEED_DEVICE", "cpu")
V, D = 37, 24


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(3 * d, d)

    def forward(self, x):
        return x + self.out(torch.relu(self.fc(self.ln(x))))


class Model(torch.nn.Module):
    """Cases real models hit: a tied embedding used as the LM head outside its module (x @
    emb.weight.t()), a module called twice per forward, optional activation checkpointing
    (non-reentrant or reentrant), a buffer."""

    def __init__(self, layers=3, ckpt=None):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.blocks = torch.nn.ModuleList(Block(D) for _ in range(layers))
        self.twice = Block(D)
        self.ln = torch.nn.LayerNorm(D)
        self.register_buffer("scale", torch.tensor(1.0))
        self.ckpt = ckpt

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            if self.ckpt is None:
                x = b(x)
            elif self.ckpt == "zspeed":
                x = zspeed.checkpointing.checkpoint(b, x)
            else:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=self.ckpt == "reentrant")
        x = self.twice(self.twice(x))
        return (self.ln(x) @ self.emb.weight.t()) * self.scale


def _data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (3, 5), generator=g) for _ in range(n)]


def _loss(engine, idx):
    logits = engine(idx.to(engine.device)).float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), idx.to(engine.device).reshape(-1))


def _cfg(stage, *, opt="none", param="none", precision="fp32", gas=1, persist=0, tmp=None, lr=1e-2, **zero):
    z = {"stage": stage, **zero}
    if stage == 3:
        z["stage3_param_persistence_threshold"] = persist
        if param != "none":
            z["offload_param"] = {"device": param, "pin_memory": True}
        if param == "nvme":  # every frozen shard on disk, through a pool smaller than the model
            z["offload_param"].update(nvme_path=str(tmp), max_in_cpu=0, buffer_count=2)
    if opt != "none":
        z["offload_optimizer"] = {"device": opt, "pin_memory": True}
        if opt == "nvme":
            z["offload_optimizer"]["nvme_path"] = str(tmp)
    c = {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": gas, "gradient_clipping": 0.5,
         "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}}, "zero_optimization": z}
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    elif precision == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return c


def _whole(engine) -> dict:
    with zspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return {k: v.detach().float().cpu().clone() for k, v in engine.module.state_dict().items()}


def _train(cfg, steps=4, ckpt=None, model=None):
    torch.manual_seed(0)
    m = model if model is not None else Model(ckpt=ckpt)
    engine, *_ = zspeed.initialize(model=m, config=cfg)
    losses = []
    for idx in _data(steps * cfg["gradient_accumulation_steps"]):
        loss = _loss(engine, idx)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return engine, losses


def _close(a, b, precision):
    tol = {"fp32": dict(rtol=1e-5, atol=1e-6), "ranks": dict(rtol=1e-3, atol=2e-4),
           "ranks-gpu": dict(rtol=1e-3, atol=1e-3)}.get(
        precision, dict(rtol=2e-2, atol=2e-2))
    assert a.keys() == b.keys()
    for k in a:
        if precision == "bf16-gpu":
            _close_bf16_gpu(k, a[k], b[k])
        else:
            torch.testing.assert_close(a[k], b[k], msg=lambda m, k=k: f"{k}: {m}", **tol)


def _close_bf16_gpu(k, a, b, steps=3, lr=1e-2):
    """bf16 runs on the GPU against another reduction order (or the CPU's kernels): where a
    gradient element is near zero, one rounding can flip its sign, and Adam then moves that
    weight by up to lr the other way: up to 2 * lr per step. Every element stays within
    2 * lr * steps, and all but a few (0.5%) within bf16's usual 2e-2."""
    d = (a.float() - b.float()).abs()
    assert d.max().item() <= 2 * lr * steps + 1e-3, f"{k}: largest difference {d.max().item():.3g}"
    far = (d > 2e-2 + 2e-2 * b.float().abs()).sum().item()
    assert far <= max(1, 0.005 * d.numel()), f"{k}: {far} of {d.numel()} elements beyond 2e-2"


def _released(engine) -> list:
    """Names of the trained parameters that hold data outside a forward/backward."""
    return [n for n, p in engine.module.named_parameters() if p.requires_grad and p.numel() > 0]


CASES = [  # (optimizer offload, param offload, precision, gas, checkpointing)
    ("none", "none", "fp32", 1, None),
    ("cpu", "cpu", "fp32", 1, None),
    ("cpu", "cpu", "bf16", 1, None),
    ("cpu", "cpu", "fp16", 1, None),
    ("cpu", "cpu", "fp32", 3, None),
    ("none", "cpu", "bf16", 2, None),
    ("cpu", "none", "fp32", 1, "non-reentrant"),
    ("cpu", "cpu", "bf16", 1, "reentrant"),
    ("nvme", "cpu", "fp32", 1, None),
    ("cpu", "cpu", "fp32", 2, "zspeed"),
]


@pytest.mark.parametrize("opt,param,precision,gas,ckpt", CASES)
def test_stage3_matches_stage2(tmp_path, opt, param, precision, gas, ckpt):
    e2, l2 = _train(_cfg(2, opt=opt, precision=precision, gas=gas, tmp=tmp_path), ckpt=ckpt)
    ref = {k: v.detach().float().cpu() for k, v in e2.module.state_dict().items()}
    e3, l3 = _train(_cfg(3, opt=opt, param=param, precision=precision, gas=gas, tmp=tmp_path), ckpt=ckpt)
    assert _released(e3) == []  # every trained parameter is back to its shard between steps
    _close(_whole(e3), ref, precision)
    assert l3 == pytest.approx(l2, rel=1e-4 if precision == "fp32" else 2e-2, abs=1e-6 if precision == "fp32" else 1e-3)
    assert e3.get_global_grad_norm() == pytest.approx(e2.get_global_grad_norm(), rel=1e-4 if precision == "fp32"
                                                      else 5e-2)
    e2.close()
    e3.close()


def test_persistent_small_parameters_and_prefetch_settings_change_nothing():
    base, _ = _train(_cfg(3, opt="cpu", param="cpu"))
    ref = _whole(base)
    # Everything persistent (threshold above every size), and no prefetch at all.
    e, _ = _train(_cfg(3, opt="cpu", param="cpu", persist=10 ** 6, stage3_prefetch_bucket_size=0))
    assert sorted(_released(e)) == sorted(n for n, p in e.module.named_parameters())
    _close(_whole(e), ref, "fp32")
    # A live-parameter cap smaller than one parameter still trains (gathers on demand).
    e, _ = _train(_cfg(3, opt="cpu", param="cpu", stage3_max_live_parameters=1))
    _close(_whole(e), ref, "fp32")


@pytest.mark.parametrize("opt", ["none", "cpu"])
def test_persistent_parameters_hold_the_stepped_weights_after_each_step_and_after_a_load(tmp_path, opt):
    """As DeepSpeed's ZeRO-3 (which gathers its persistent parameters after every step and after
    a load): a script that reads a persistent parameter between steps, outside any forward,
    sees the weights the last step made, not those of the forward before it; and a load makes
    them whole with the loaded values. The masters are the reference (fp32: exact)."""
    from zspeed.utils import safe_get_full_fp32_param
    cfg = _cfg(3, opt=opt, param=opt, persist=100)  # the biases and norms are persistent
    e, _ = _train(cfg, steps=3)
    small = {n: p for n, p in e.module.named_parameters() if p.ds_persist}
    assert small and all(p.numel() == p.ds_numel for p in small.values())
    for n, p in small.items():
        assert torch.equal(p.detach().cpu(), safe_get_full_fp32_param(p).cpu().reshape(p.shape)), n
    e.save_checkpoint(str(tmp_path), tag="t")
    torch.manual_seed(5)
    e2, *_ = zspeed.initialize(model=Model(), config=cfg)
    e2.load_checkpoint(str(tmp_path), tag="t")
    for n, p in e2.module.named_parameters():
        if p.ds_persist:
            assert torch.equal(p.detach().cpu(), small[n].detach().cpu()), n
    e.close()
    e2.close()


@pytest.mark.parametrize("stage", [2, 3])
def test_empty_partition_cache_releases_gathered_parameters_and_changes_nothing(stage, tmp_path):
    """DeepSpeed's engine.empty_partition_cache() between steps: every gathered parameter goes
    back to its shard, the persistent ones too (as DeepSpeed's does; the next forward gathers
    them again), and training goes on bit for bit as without it."""
    cfg = _cfg(stage, opt="cpu", param="cpu", persist=100)  # persist: biases and norms stay whole
    ref, _ = _train(cfg)
    e, _ = _train(cfg, steps=0)
    for idx in _data(4):
        loss = _loss(e, idx)
        e.backward(loss)
        e.step()
        e.empty_partition_cache()
        if stage == 3:
            whole = {n: p.numel() for n, p in e.module.named_parameters() if p.numel() > 0}
            assert not whole and any(p.ds_persist for p in e.module.parameters()), whole
    a, b = _whole(ref), _whole(e)
    assert all(torch.equal(a[k], b[k]) for k in a)
    if stage == 3:  # a save gathers the persistent ones again (DeepSpeed's checkpoint_event_epilogue)
        e.empty_partition_cache()
        e.save_checkpoint(tmp_path, tag="t")
        persistent = [(n, p) for n, p in e.module.named_parameters() if p.ds_persist]
        assert persistent and all(p.numel() == p.ds_numel for _, p in persistent)
        assert all(p.numel() == 0 for p in e.module.parameters() if not p.ds_persist)
    e.close()
    with pytest.raises(EngineClosedError):
        e.empty_partition_cache()


def test_partitioned_parameters_carry_deepspeeds_attributes():
    """ds_id (unique), ds_persist and ds_status, which libraries read (peft, accelerate)."""
    from zspeed.runtime.zero.partition_parameters import ZeroParamStatus as S
    e, _ = _train(_cfg(3, opt="cpu", param="cpu", persist=100), steps=1)
    params = dict(e.module.named_parameters())
    assert len({p.ds_id for p in params.values()}) == len(params)
    for n, p in params.items():
        assert p.ds_persist == (p.ds_numel <= 100), n
        assert p.ds_status == (S.AVAILABLE if p.ds_persist else S.NOT_AVAILABLE), n
    with zspeed.zero.GatheredParameters(list(params.values())):
        assert all(p.ds_status == S.AVAILABLE for p in params.values())
    assert all(p.ds_status == S.NOT_AVAILABLE for p in params.values() if not p.ds_persist)
    e.close()


def test_eval_and_no_grad_forward_equal_the_whole_model():
    e3, _ = _train(_cfg(3, opt="cpu", param="cpu", precision="bf16"))
    e2, _ = _train(_cfg(2, opt="cpu", precision="bf16"))
    idx = _data(1, seed=9)[0].to(e3.device)
    e3.eval()
    e2.eval()
    with torch.no_grad():
        a, b = e3(idx), e2(idx)
        c = e3.module(idx)  # the module itself, outside the engine
    torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(a, c)
    assert _released(e3) == []


@pytest.mark.parametrize("sanity", [False, True])
def test_gathered_parameters_reads_and_edits_reach_the_masters(sanity, caplog):
    """Without modifier_rank an edit is discarded: with a warning by default, with RuntimeError
    under zero_optimization.enable_sanity_checks (DeepSpeed's rule); with one it is kept."""
    e, _ = _train(_cfg(3, opt="cpu", param="cpu", lr=0.0, enable_sanity_checks=sanity), steps=1)
    w = e.module.emb.weight
    assert w.numel() == 0 and tuple(w.ds_shape) == (V, D) and w.ds_enable_sanity_checks is sanity
    with zspeed.zero.GatheredParameters(w):
        assert tuple(w.shape) == (V, D)
        before = w.detach().clone()
    assert w.numel() == 0
    with pytest.raises(RuntimeError, match="modifier_rank=None") if sanity else contextlib.nullcontext():
        with caplog.at_level("WARNING", logger="zspeed"):
            with zspeed.zero.GatheredParameters([w], modifier_rank=None), torch.no_grad():
                w.zero_()  # discarded: no modifier rank
    if not sanity:
        assert any("edits were discarded" in r.getMessage() and "enable_sanity_checks" in r.getMessage()
                   for r in caplog.records)
    assert torch.equal(_whole(e)["emb.weight"], before.float().cpu())
    with zspeed.zero.GatheredParameters([w], modifier_rank=0), torch.no_grad():
        w.fill_(0.25)
    # A step at lr 0 writes the masters back into the weights: the edit must be in them.
    loss = _loss(e, _data(1)[0])
    e.backward(loss)
    e.step()
    assert torch.all(_whole(e)["emb.weight"] == 0.25)


@pytest.mark.parametrize("how", ["in place", "through p.data"])
def test_gathered_parameters_without_modifier_rank_discards_every_edit(how):
    """Persistent parameters (at or below stage3_param_persistence_threshold: biases, norms) stay
    gathered between forwards; an edit to them without a modifier rank must be discarded like any
    other, and an edit through ``p.data`` (which no version counter sees) must be seen too."""
    e, _ = _train(_cfg(3, opt="cpu", param="cpu", persist=10_000, enable_sanity_checks=True), steps=1)
    before = _whole(e)
    params = [p for _, p in e.module.named_parameters()]
    small = [p for p in params if p.numel() > 0]  # persistent: materialized between forwards
    assert small, "the test needs persistent parameters"
    with pytest.raises(RuntimeError, match="modifier_rank=None"):
        with zspeed.zero.GatheredParameters(params), torch.no_grad():
            for p in params:
                (p.data if how == "through p.data" else p).add_(1.0)
    after = _whole(e)
    for k in before:
        assert torch.equal(after[k], before[k]), k
    for p in small:  # the materialized copies hold the shards' values again
        assert torch.equal(p.detach().float().cpu().reshape(-1),
                           before[[n for n, q in e.module.named_parameters() if q is p][0]].reshape(-1))
    with pytest.raises(ValueError, match="modifier_rank"):
        with zspeed.zero.GatheredParameters(params, modifier_rank=3):
            pass


def _seeded_model(device=None) -> Model:
    torch.manual_seed(0)
    with torch.device(device or "cpu"):
        m = Model()
    return m.cpu()


@pytest.mark.parametrize("init_device", ["default", "cpu"])
def test_zero_init_builds_in_the_training_dtype_and_trains_the_same(init_device, monkeypatch):
    """zero.Init builds where DeepSpeed's does, on the GPU the engine will use (ZSPEED_INIT_DEVICE
    =cpu: on the CPU): the initial values are those torch draws there from the seed (a GPU's
    generator is not the CPU's, so with a GPU they differ from a model built without zero.Init,
    as in DeepSpeed), rounded to the training dtype; and training from them is training the
    same model built without zero.Init from the same values."""
    if init_device == "cpu":
        monkeypatch.setenv("ZSPEED_INIT_DEVICE", "cpu")
    cfg = _cfg(3, opt="cpu", param="cpu", precision="bf16")
    build = zspeed.zero._build_device()
    assert (build is None) == (init_device == "cpu" or DEVICE == "cpu")
    torch.manual_seed(0)
    with zspeed.zero.Init(config_dict_or_path=cfg):
        m = Model()
    assert all(p.dtype == torch.bfloat16 and p.device.type == "cpu" for p in m.parameters())
    drawn = _seeded_model(build)
    start = dict(m.named_parameters())
    for n, p in drawn.named_parameters():  # the values of a build on that device, rounded once
        assert torch.equal(start[n].detach(), p.detach().to(torch.bfloat16)), n
    ref, _ = _train(cfg, model=drawn)
    e, _ = _train(cfg, model=m)
    _close(_whole(e), _whole(ref), "bf16")


def test_zero_init_keeps_the_dtype_switch_and_refuses_unknown_devices():
    with zspeed.zero.Init(enabled=False):
        assert Model().emb.weight.dtype == torch.float32
    with pytest.raises(zspeed.zero.ZeRO3NotSupported, match="remote_device"):
        zspeed.zero.Init(remote_device="disk")


def test_external_parameter_registration_is_honoured():
    e, _ = _train(_cfg(3, opt="cpu", param="cpu"), steps=1)
    zspeed.zero.register_external_parameter(e.module.twice, e.module.emb.weight)
    f = e._fetcher
    assert f.states[id(e.module.emb.weight)] in f._external[id(e.module.twice)]
    zspeed.zero.unregister_external_parameter(e.module.twice, e.module.emb.weight)
    assert f.states[id(e.module.emb.weight)] not in f._external.get(id(e.module.twice), [])


def test_checkpoints_move_between_stages(tmp_path):
    e3, _ = _train(_cfg(3, opt="cpu", param="cpu"), steps=2)
    e3.save_checkpoint(tmp_path, tag="s3")
    whole = _whole(e3)
    nxt = _data(3, seed=5)

    def cont(e):
        for idx in nxt:
            loss = _loss(e, idx)
            e.backward(loss)
            e.step()
        return _whole(e)
    after = cont(e3)
    for stage, kw in ((3, dict(opt="cpu", param="cpu")), (3, dict(opt="cpu")), (2, dict(opt="cpu"))):
        e, _ = _train(_cfg(stage, **kw), steps=1)
        path, _ = e.load_checkpoint(tmp_path, tag="s3")
        assert path is not None
        _close(_whole(e), whole, "fp32")
        _close(cont(e), after, "fp32")  # resumes exactly: optimizer state and counters came back
    # And a ZeRO-2 checkpoint into stage 3.
    e2, _ = _train(_cfg(2, opt="cpu"), steps=2)
    e2.save_checkpoint(tmp_path, tag="s2")
    e, _ = _train(_cfg(3, opt="cpu", param="cpu"), steps=1)
    e.load_checkpoint(tmp_path, tag="s2")
    _close(_whole(e), {k: v.float().cpu() for k, v in e2.module.state_dict().items()}, "fp32")
    # Weights only.
    e, _ = _train(_cfg(3, opt="cpu", param="cpu"), steps=1)
    e.load_checkpoint(tmp_path, tag="s3", load_optimizer_states=False)
    _close(_whole(e), whole, "fp32")
    # zspeed to-fp32 consolidates the partitioned checkpoint.
    out = tmp_path / "fp32.safetensors"
    r = subprocess.run([sys.executable, "-m", "zspeed", "to-fp32", str(tmp_path / "s3"), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from safetensors.torch import load_file
    got = load_file(str(out))
    for k in whole:
        torch.testing.assert_close(got[k], whole[k], rtol=1e-6, atol=1e-7, msg=k)


def test_consolidated_16bit_state_dict():
    e, _ = _train(_cfg(3, opt="cpu", param="cpu", precision="bf16"), steps=1)
    sd = e._zero3_consolidated_16bit_state_dict()
    assert sd["emb.weight"].dtype == torch.bfloat16 and tuple(sd["emb.weight"].shape) == (V, D)
    assert sd.keys() == _whole(e).keys()


def test_config_errors_name_the_fix():
    # offload_param below stage 3: DeepSpeed ignores it (accelerate's plugin writes it at stage 2);
    # zspeed says so and trains with the parameters whole, as with no offload_param
    for device in ("cpu", "nvme"):
        c = {**_cfg(2), "zero_optimization": {"stage": 2, "offload_param": {"device": device}}}
        with pytest.warns(RuntimeWarning, match=f"offload_param is used only by ZeRO stage 3.*offload_param "
                                                f"\\(device '{device}'\\) has no effect.*\"stage\": 3"):
            e, losses = _train(c, steps=2)
        ref, want = _train(_cfg(2), steps=2)
        assert losses == want and all(p.numel() == p.ds_numel if hasattr(p, "ds_numel") else p.numel() > 0
                                      for p in e.module.parameters())
    with pytest.raises(ConfigError, match="offload_param.nvme_path is required"):
        zspeed.initialize(model=Model(), config={**_cfg(3), "zero_optimization": {
            "stage": 3, "offload_param": {"device": "nvme"}}})


# -- several ranks (Gloo) ---------------------------------------------------------------------------
WORKER = r'''
import json, os, sys
sys.path.insert(0, HERE)
import torch, zspeed
import test_zero3 as T
a = json.loads(os.environ["ZS_Z3_ARGS"])
zspeed.init_distributed()
rank, ws = zspeed.comm.get_rank(), zspeed.comm.get_world_size()
torch.manual_seed(0)
build = T.LoRA if a.get("lora") else (lambda: T.Model(ckpt=a["ckpt"]))
if a["init"]:
    with zspeed.zero.Init(config_dict_or_path=a["cfg"]):
        m = build()
else:
    m = build()
    if a.get("start"):  # the values another run's zero.Init drew (on a GPU, from its generator)
        m.load_state_dict(torch.load(a["start"]), strict=False)
e, *_ = zspeed.initialize(model=m, config=a["cfg"])
if a["init"]:  # what every rank starts from (rank 0's values, broadcast), for the references
    torch.save(T._whole(e), a["out"] + f".start.{rank}.pt")
for i, idx in enumerate(T._data(a["steps"] * a["cfg"]["gradient_accumulation_steps"])):
    mine = torch.cat([idx, idx.flip(0)]).chunk(ws)[rank]   # 6 sequences per micro-batch in all
    loss = T._loss(e, mine)
    e.backward(loss)
    e.step()
full_disk_error = None
if a.get("full_disk") is not None:  # rank 0's disk fills up after that many bytes of the save
    from zspeed.runtime import checkpoint_files as cf
    real, left = cf._write, [a["full_disk"] if rank == 0 else float("inf")]
    def write(fd, data):
        if left[0] <= 0:
            raise OSError(28, "No space left on device")
        n = int(min(len(data), left[0]))
        left[0] -= n
        return real(fd, data[:n])
    cf._write = write
    try:
        e.save_checkpoint(a["save"], tag="t")
    except cf.CheckpointError as ex:
        full_disk_error = str(ex)
    cf._write = real
if a.get("save"):
    e.save_checkpoint(a["save"], tag="t")
if a.get("load"):
    e.load_checkpoint(a["load"], tag="t")
torch.save({"state": T._whole(e), "norm": e.get_global_grad_norm(), "released": T._released(e),
            "full_disk_error": full_disk_error}, a["out"] + f".{rank}.pt")
'''.replace("HERE", repr(os.path.dirname(os.path.abspath(__file__))))


def _ranks(n, cfg, tmp, tag, steps=3, init=False, ckpt=None, **kw):
    out = str(tmp / tag)
    args = dict(cfg=cfg, steps=steps, out=out, init=init, ckpt=ckpt, **kw)
    env = {"ZS_Z3_ARGS": json.dumps(args)}
    # tests/gpu/check_zero3_cuda.py runs these on CUDA by setting these two; the CPU suite does not.
    env.update({k: os.environ[k] for k in ("ZS_RANK_DEVICE", "ZSPEED_DIST_BACKEND") if k in os.environ})
    if "ZS_RANK_DEVICE" in env:
        env["ZSPEED_DEVICE"] = env.pop("ZS_RANK_DEVICE")
    res = run_ranks(n, WORKER, env=env, timeout=300)
    for r in res:
        assert r.returncode == 0, r
    return [torch.load(f"{out}.{r}.pt") for r in range(n)]


def _ref(cfg, steps=3, ckpt=None, start=None):
    """One process, ZeRO-2, micro-batches of all 6 sequences (tolerance: see "ranks" in _close);
    ``start``: a file of initial values (else the seeded model's)."""
    torch.manual_seed(0)
    m = Model(ckpt=ckpt)
    if start is not None:
        m.load_state_dict(torch.load(start), strict=False)
    engine, *_ = zspeed.initialize(model=m, config={**cfg, "train_micro_batch_size_per_gpu": 6})
    for idx in _data(steps * cfg["gradient_accumulation_steps"]):
        loss = _loss(engine, torch.cat([idx, idx.flip(0)]))
        engine.backward(loss)
        engine.step()
    return {k: v.detach().float().cpu() for k, v in engine.module.state_dict().items()}


RANK_CASES = [  # (ranks, optimizer offload, param offload, precision, gas, zero.Init, checkpointing)
    (2, "cpu", "cpu", "fp32", 1, False, None),
    (3, "none", "none", "fp32", 2, False, None),
    (2, "cpu", "cpu", "bf16", 1, True, "non-reentrant"),
    (2, "nvme", "cpu", "fp32", 1, True, None),
]


@pytest.mark.skipif(DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
@pytest.mark.parametrize("n,opt,param,precision,gas,init,ckpt", RANK_CASES)
def test_ranks_match_stage2_and_one_process(tmp_path, n, opt, param, precision, gas, init, ckpt):
    """ZeRO-3 on n ranks equals ZeRO-2 on the same ranks and one process. With zero.Init the
    ranks start from rank 0's values as zero.Init drew them (on a GPU, from the GPU's generator:
    other values than the CPU's from the same seed, as in DeepSpeed); every rank must start
    from the same ones, and the references start from them too."""
    mb = 6 // n
    cfg = dict(_cfg(3, opt=opt, param=param, precision=precision, gas=gas, tmp=tmp_path),
               train_micro_batch_size_per_gpu=mb)
    outs = _ranks(n, cfg, tmp_path, "z3", init=init, ckpt=ckpt)
    start = None
    if init:
        starts = [torch.load(f"{tmp_path / 'z3'}.start.{r}.pt") for r in range(n)]
        for s in starts[1:]:
            for k in s:
                assert torch.equal(s[k], starts[0][k]), k  # rank 0's values on every rank
        start = str(tmp_path / "start.pt")
        torch.save({k: v for k, v in starts[0].items() if k != "scale"}, start)
    cfg2 = dict(_cfg(2, opt=opt, precision=precision, gas=gas, tmp=tmp_path), train_micro_batch_size_per_gpu=mb)
    ref = _ranks(n, cfg2, tmp_path, "z2", ckpt=ckpt, start=start)[0]["state"]
    one = _ref(_cfg(2, opt="cpu", precision=precision, gas=gas), ckpt=ckpt, start=start)
    on_gpu = os.environ.get("ZS_RANK_DEVICE", "").startswith("cuda") or \
        os.environ.get("ZSPEED_DIST_BACKEND") == "nccl"
    for o in outs:
        assert o["released"] == []
        # the same ranks at ZeRO-2: same sums, same updates (bf16 on a GPU: see _close_bf16_gpu)
        _close(o["state"], ref, "bf16-gpu" if on_gpu and precision == "bf16" else precision)
        # One process sums the gradient in another order than several ranks do, and Adam's
        # early steps divide by sqrt(v) of the gradient's own size: where a gradient element
        # is near zero, rounding of 1e-7 reaches ~1e-4 in the weight after 3 steps.
        # On CUDA (tests/gpu/check_zero3_cuda.py) the one-process reference still runs on the
        # CPU, whose matmuls round differently: the same amplification reaches ~3e-4.
        _close(o["state"], one, ("ranks-gpu" if on_gpu else "ranks") if precision == "fp32" else
               "bf16-gpu" if on_gpu else precision)
    for o in outs[1:]:
        for k in o["state"]:
            assert torch.equal(o["state"][k], outs[0]["state"][k]), k


@pytest.mark.skipif(DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
def test_checkpoint_across_world_sizes(tmp_path):
    cfg2 = _cfg(3, opt="cpu", param="cpu")
    cfg2["train_micro_batch_size_per_gpu"] = 3
    saved = _ranks(2, cfg2, tmp_path, "save", save=str(tmp_path / "ck"))
    cfg3 = dict(cfg2, train_micro_batch_size_per_gpu=2)
    loaded = _ranks(3, cfg3, tmp_path, "load", steps=1, load=str(tmp_path / "ck"))
    for o in loaded:
        _close(o["state"], saved[0]["state"], "fp32")
    e, _ = _train(_cfg(3, opt="cpu", param="cpu"), steps=1)  # and into one process
    e.load_checkpoint(tmp_path / "ck", tag="t")
    _close(_whole(e), saved[0]["state"], "fp32")


@pytest.mark.skipif(DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
def test_a_full_disk_while_rank_0_writes_the_gathered_weights_fails_the_save_on_every_rank(tmp_path):
    """A ZeRO-3 save gathers each weight as rank 0 writes it (the other ranks make the same
    gathers in the same order). When rank 0's disk fills up midway through model.safetensors,
    it still makes the remaining gathers, so no rank waits forever: every rank gets the
    CheckpointError, nothing is left behind, and the next save (with space) works."""
    cfg = _cfg(3, opt="cpu", param="cpu")
    cfg["train_micro_batch_size_per_gpu"] = 3
    ck = tmp_path / "ck"
    outs = _ranks(2, cfg, tmp_path, "full", save=str(ck), full_disk=6000)
    for o in outs:
        assert o["full_disk_error"] is not None and "disk is full" in o["full_disk_error"], o["full_disk_error"]
    # the second save (and the zero_to_fp32.py it writes, as DeepSpeed)
    assert sorted(n for n in os.listdir(ck) if not n.startswith(".")) == ["latest", "t", "zero_to_fp32.py", "zero_to_torch.py"]
    e, _ = _train(_cfg(3, opt="cpu", param="cpu"), steps=1)
    e.load_checkpoint(ck, tag="t")
    for k, v in _whole(e).items():
        assert torch.equal(v, outs[0]["state"][k]), k


def test_a_configuration_whose_gpu_tensors_cannot_fit_is_refused_with_the_numbers(monkeypatch):
    from zspeed.runtime import memory
    model = Model()
    n = sum(p.numel() for p in model.parameters())
    cfg = _cfg(3, precision="bf16")  # shards, masters and Adam state on the device
    seen = []
    real = memory.check_gpu_memory

    def check(need, *a, **k):  # what the components report for the GPU tier
        seen.append(need)
        return real(need, *a, **k)
    monkeypatch.setattr(memory, "check_gpu_memory", check)
    monkeypatch.setattr(memory, "gpu_room", lambda dev: 1000)
    with pytest.raises(ConfigError, match=r"keeps .* GiB on .* before any activation .* this process may use "
                                          r"0.00 GiB there\. Nothing was allocated\. To fit: .*offload_optimizer"):
        zspeed.initialize(model=model, config=cfg)
    need = seen[-1]
    # bf16 shards (2 bytes, padded), fp32 reduced gradients (4), fp32 masters + Adam's moments (12).
    assert need["parameter shards"] >= 2 * n and need["gradients (this rank's part, fp32)"] >= 4 * n
    assert need["fp32 masters and optimizer state (fp32)"] >= 12 * n
    monkeypatch.setattr(memory, "gpu_room", lambda dev: 1 << 40)
    zspeed.initialize(model=Model(), config=cfg)
    # With both offloads only the working set stays: less than the whole model's weights here
    # (the deepest module path is one block; prefetch 0, persistence 0).
    cfg = _cfg(3, opt="cpu", param="cpu", precision="bf16", stage3_prefetch_bucket_size=0)
    zspeed.initialize(model=Model(), config=cfg)
    assert list(seen[-1]) == ["gathered parameters (deepest module path + prefetch + persistent)"]
    assert 0 < seen[-1]["gathered parameters (deepest module path + prefetch + persistent)"] < 2 * n


def test_a_configuration_that_cannot_fit_in_host_memory_is_refused_before_allocating(monkeypatch):
    from zspeed.runtime import memory
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 10_000)
    with pytest.raises(ConfigError, match=r"needs .* GiB of host memory .*state_dtype \"int8\""):
        zspeed.initialize(model=Model(), config=_cfg(3, opt="cpu", param="cpu"))
    monkeypatch.setenv("ZSPEED_SKIP_MEMORY_CHECK", "1")
    zspeed.initialize(model=Model(), config=_cfg(3, opt="cpu", param="cpu"))
    monkeypatch.delenv("ZSPEED_SKIP_MEMORY_CHECK")
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 1 << 40)
    e = zspeed.initialize(model=Model(), config=_cfg(3, opt="cpu", param="cpu", precision="bf16"))[0]
    # The estimate itself (what the components report for host memory, per rank): 2 bytes per
    # element of the bf16 shards, 4 of the masters, 8 of Adam's fp32 moments; the gradients land
    # in the shards (offload_param.grads_in_shards, the default), or take 2 more bytes without.
    local = e.memory_needs["host"]["parameters"] // 2
    assert local >= sum(p.numel() for p in Model().parameters())
    assert e.memory_needs["host"] == {"parameters": 2 * local, "fp32 masters": 4 * local,
                                      "optimizer state (fp32)": 8 * local}
    cfg = _cfg(3, opt="cpu", param="cpu", precision="bf16")
    cfg["zero_optimization"]["offload_param"]["grads_in_shards"] = False
    e = zspeed.initialize(model=Model(), config=cfg)[0]
    assert e.memory_needs["host"] == {"parameters": 2 * local, "gradients": 2 * local, "fp32 masters": 4 * local,
                                      "optimizer state (fp32)": 8 * local}


def test_save_16bit_model(tmp_path):
    e, _ = _train(_cfg(3, opt="cpu", param="cpu", precision="bf16"), steps=1)
    assert e.save_16bit_model(tmp_path) is False  # stage 3 needs the gather key, as in DeepSpeed
    cfg = _cfg(3, opt="cpu", param="cpu", precision="bf16")
    cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    e, _ = _train(cfg, steps=1)
    whole = _whole(e)
    assert e.save_16bit_model(tmp_path, "model.safetensors")
    assert e.save_16bit_model(tmp_path)
    from safetensors.torch import load_file
    st = load_file(str(tmp_path / "model.safetensors"))
    pt = torch.load(tmp_path / "pytorch_model.bin")
    for k in whole:
        assert pt[k].dtype in (torch.bfloat16, torch.float32) and torch.equal(pt[k].float(), whole[k])
        if k in st:
            assert torch.equal(st[k].float(), whole[k])


def test_too_little_disk_for_nvme_offload_is_refused_before_writing(tmp_path, monkeypatch):
    import shutil
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(ConfigError, match=r"needs .* KiB of free space in nvme_path .*state_dtype \"int8\""):
        zspeed.initialize(model=Model(), config=_cfg(3, opt="nvme", param="cpu", tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []


class LoRA(torch.nn.Module):
    """A frozen base model with small trainable adapters (LoRA-style fine-tuning)."""

    def __init__(self, layers=4):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.base = torch.nn.ModuleList(torch.nn.Linear(D, D) for _ in range(layers))
        self.a = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(D, 4) * 0.1) for _ in range(layers))
        self.b = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(4, D) * 0.1) for _ in range(layers))
        for p in list(self.emb.parameters()) + list(self.base.parameters()):
            p.requires_grad_(False)

    def forward(self, idx):
        x = self.emb(idx)
        for lin, a, b in zip(self.base, self.a, self.b):
            x = torch.tanh(lin(x) + x @ a @ b)
        return x @ self.emb.weight.t()


def test_frozen_parameters_are_partitioned_and_released_during_backward():
    def run(stage, **kw):
        torch.manual_seed(0)
        e, _ = _train(_cfg(stage, opt="cpu", **kw), model=LoRA())
        return e
    e2 = run(2)
    e3 = run(3, param="cpu", stage3_prefetch_bucket_size=0)
    frozen = [n for n, p in e3.module.named_parameters() if not p.requires_grad]
    assert frozen and all(e3.module.get_parameter(n).numel() == 0 for n in frozen)  # partitioned
    ref = {k: v.detach().float().cpu() for k, v in e2.module.state_dict().items()}
    _close(_whole(e3), ref, "fp32")
    f = e3._fetcher
    peak = [0]
    gather = f._gather

    def watch(sts):
        gather(sts)
        peak[0] = max(peak[0], sum(st.numel for st in f.states.values() if st.sm is f.frozen and st.full is not None))
    f._gather = watch
    loss = _loss(e3, _data(1)[0])
    peak[0] = 0
    e3.backward(loss)
    # Each frozen Linear (600 elements) is dropped once the gradient of its input is computed;
    # the embedding (888, also the head) is held through backward. Without that, backward would
    # hold all 3288 frozen elements.
    assert peak[0] <= V * D + 2 * (D * D + D)
    e3.step()
    sd = e3._zero3_consolidated_16bit_state_dict()
    assert tuple(sd["base.0.weight"].shape) == (D, D)
    torch.testing.assert_close(sd["base.0.weight"].float(), ref["base.0.weight"])


@pytest.mark.skipif(DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
def test_frozen_parameters_with_ranks_and_zero_init(tmp_path):
    cfg2 = dict(_cfg(2, opt="cpu"), train_micro_batch_size_per_gpu=3)
    ref = _ranks(2, cfg2, tmp_path, "l2", lora=True)[0]["state"]
    for param, init in (("cpu", False), ("cpu", True), ("nvme", True)):
        cfg3 = dict(_cfg(3, opt="cpu", param=param, tmp=tmp_path), train_micro_batch_size_per_gpu=3)
        outs = _ranks(2, cfg3, tmp_path, f"l3{param}{init}", lora=True, init=init)
        for o in outs:
            _close(o["state"], ref, "fp32")


def test_max_reuse_distance_keeps_a_parameter_used_again_soon():
    """The twice-called module is gathered once per forward when the reuse distance covers the
    gathers between its two calls, twice when it is 0; the results are equal."""
    def gathers(reuse):
        e, _ = _train(_cfg(3, opt="cpu", param="cpu", stage3_prefetch_bucket_size=0,
                           stage3_max_reuse_distance=reuse), steps=1)  # the first step records the order
        f = e._fetcher
        n = [0]
        gather = f._gather

        def count(sts):
            n[0] += sum(1 for st in sts if st.full is None)
            gather(sts)
        f._gather = count
        with torch.no_grad():
            out = e(_data(1, seed=7)[0].to(e.device))
        assert _released(e) == []  # kept parameters are released when the forward ends
        return n[0], out
    far, a = gathers(10 ** 9)
    none, b = gathers(0)
    assert torch.equal(a, b)
    twice = 6  # the twice-called block's parameters (ln, fc, out: weight and bias)
    assert none - far == twice


def test_zero_size_parameters():
    """A parameter with no elements (it shares a partition unit with the next one) trains,
    gathers and saves like the rest."""
    class WithEmpty(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.empty = torch.nn.Parameter(torch.zeros(0, 3))
            self.inner = Model()

        def forward(self, idx):
            return self.inner(idx) + self.empty.sum()
    outs = []
    for stage, kw in ((2, {}), (3, dict(param="cpu"))):
        torch.manual_seed(0)
        e, _ = _train(_cfg(stage, opt="cpu", **kw), model=WithEmpty())
        assert tuple(e.module.empty.shape) == (0, 3)
        outs.append(_whole(e))
    _close(outs[1], outs[0], "fp32")


# -- offload_param nvme (zero3_nvme.py) --------------------------------------------------------------
def _swap_files(folder) -> list:
    return sorted(n for n in os.listdir(folder) if n.endswith("_param.swap"))


def _lora_engine(param, tmp, steps=3, **zero):
    torch.manual_seed(0)
    e, _ = _train(_cfg(3, opt="cpu", param=param, tmp=tmp, **zero), steps=steps, model=LoRA())
    return e


@pytest.mark.parametrize("zero", [{}, {"stage3_prefetch_bucket_size": 0},
                                  {"offload_param_extra": {"buffer_count": 1}},
                                  {"offload_param_extra": {"max_in_cpu": 1500}}],
                         ids=["prefetch", "no-prefetch", "one-buffer", "some-in-cpu"])
def test_frozen_parameters_on_nvme_train_exactly_like_host_memory(tmp_path, zero):
    zero = dict(zero)
    extra = zero.pop("offload_param_extra", {})
    ref = _whole(_lora_engine("cpu", tmp_path, **zero))
    cfg = _cfg(3, opt="cpu", param="nvme", tmp=tmp_path, **zero)
    cfg["zero_optimization"]["offload_param"].update(extra)
    torch.manual_seed(0)
    e, _ = _train(cfg, steps=3, model=LoRA())
    sm = e._fetcher.frozen
    assert getattr(sm, "nvme", False) and not getattr(e._fetcher.sm, "nvme", False)  # trained ones: host
    assert _swap_files(tmp_path) == [os.path.basename(sm.disk.path)]
    if "max_in_cpu" in extra:
        assert 0 < sm.resident_elems <= extra["max_in_cpu"] and sm.on_disk_elems > 0
    else:
        assert sm.resident_elems == 0
    got = _whole(e)
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    e.close()
    assert _swap_files(tmp_path) == []


@pytest.mark.parametrize("piece", [1, 2, 3, 5])
def test_nvme_read_failure_raises_and_the_same_step_can_be_run_again(tmp_path, piece):
    # Whichever read fails (the root's first gather, a module's, a prefetch landing later),
    # the forward raises and the next ones train exactly.
    from zspeed import NativeError
    from zspeed._native import errcode, lib
    ref = _whole(_lora_engine("cpu", tmp_path, steps=3))
    e = _lora_engine("nvme", tmp_path, steps=1)
    idx = _data(3)[1]
    e._fetcher.settle()  # no read of the last step still in flight: the count starts here
    lib.zs_fault_set(b"aio.io", piece, 1, errcode("ZS_EIO"))
    try:
        with pytest.raises(NativeError) as ei:
            _loss(e, idx)
    finally:
        lib.zs_fault_clear()
    assert ei.value.name == "ZS_EIO" and "_param.swap" in str(ei.value)
    for idx in _data(3)[1:]:  # the failed forward left nothing behind: train on
        loss = _loss(e, idx)
        e.backward(loss)
        e.step()
    got = _whole(e)
    for k in ref:
        assert torch.equal(got[k], ref[k]), k


def test_gathered_parameters_edits_reach_the_nvme_file_and_a_failed_write_keeps_the_old_value(tmp_path):
    from zspeed import NativeError
    from zspeed._native import errcode, lib
    e = _lora_engine("nvme", tmp_path, steps=1)
    w = e.module.base[1].weight
    with zspeed.zero.GatheredParameters([w]):
        old = w.detach().clone()
    # Pieces: 1 gathers the parameter, 2 reads its shard for the update, 3 writes it.
    e._fetcher.settle()  # no prefetched read still in flight to take a number
    lib.zs_fault_set(b"aio.io", 3, 1, errcode("ZS_EIO"))
    try:
        with pytest.raises(NativeError, match="writing a parameter shard"):
            with zspeed.zero.GatheredParameters([w], modifier_rank=0):
                w.data.fill_(0.25)
    finally:
        lib.zs_fault_clear()
    with zspeed.zero.GatheredParameters([w]):
        assert torch.equal(w.detach(), old)
    with zspeed.zero.GatheredParameters([w], modifier_rank=0):
        w.data.fill_(0.5)
    with zspeed.zero.GatheredParameters([w]):
        assert bool((w.detach() == 0.5).all())
    e.close()


def test_checkpoints_move_between_nvme_and_host_parameter_offload(tmp_path):
    for src, dst in (("nvme", "cpu"), ("cpu", "nvme")):
        a = _lora_engine(src, tmp_path, steps=2)
        with zspeed.zero.GatheredParameters([a.module.base[0].weight], modifier_rank=0):
            a.module.base[0].weight.data.mul_(2)  # a frozen weight the checkpoint must carry
        a.save_checkpoint(str(tmp_path / f"ck-{src}"))
        want = _whole(a)
        b = _lora_engine(dst, tmp_path, steps=1)
        b.load_checkpoint(str(tmp_path / f"ck-{src}"))
        got = _whole(b)
        for k in want:
            assert torch.equal(got[k], want[k]), (src, dst, k)


def test_nvme_parameter_config_errors(tmp_path):
    cfg = _cfg(3, opt="cpu", param="nvme", tmp=tmp_path)
    cfg["zero_optimization"]["offload_param"]["buffer_size"] = 100
    with pytest.raises(ConfigError, match=r"buffer_size = 100 elements .* set buffer_size to at least"):
        zspeed.initialize(model=LoRA(), config=cfg)
    cfg["zero_optimization"]["offload_param"].update(buffer_size=1e8, nvme_path=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="offload_param.nvme_path .* is not an existing directory"):
        zspeed.initialize(model=LoRA(), config=cfg)
    assert _swap_files(tmp_path) == []
