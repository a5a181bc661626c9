"""Data-parallel ZeRO (stages 0, 1, 2) with 2 and 3 ranks on the CPU (Gloo): after N steps
the weights match one process training on the same global batches.

Tolerances: the ranks' gradients are summed in a different order than one process sums
the whole batch's, which changes the last bits of each gradient; fp32 weights agree to
1e-5 relative after 6 AdamW steps, bf16 models (whose communication is in bf16, as
DeepSpeed's default) to a few bf16 ulps."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the runtime needs torch")

from distrun import run_ranks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# The exit status of a rank that kills itself with os.kill(pid, SIGKILL): -9 on POSIX; Windows
# has no SIGKILL, and os.kill(pid, 9) there is TerminateProcess with exit code 9.
KILLED = 9 if os.name == "nt" else -9
WORKER = open(os.path.join(HERE, "dp_worker.py")).read().replace(
    "os.path.dirname(os.path.abspath(__file__))", repr(HERE))


def _cfg(stage, device="none", precision="fp32", gas=1, clip=0.0, mb=2, tmp=None, state_dtype="fp32"):
    c = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": gas,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
         "gradient_clipping": clip, "zero_optimization": {"stage": stage}}
    if device != "none":
        off = {"device": device}
        if device == "nvme":
            off["nvme_path"] = str(tmp)
        c["zero_optimization"]["offload_optimizer"] = off
        if state_dtype != "fp32":
            c["optimizer"]["params"]["state_dtype"] = state_dtype
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    if precision == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return c


def _run(n, cfg, tmp, tag, steps=6, **kw):
    out = str(tmp / tag)
    args = dict(config=cfg, steps=steps, global_batch=6, out=out, **kw)
    env = {"ZS_DP_ARGS": json.dumps(args)}
    # tests/gpu/check_dp_cuda.py runs these on CUDA by setting these two; the CPU suite does not.
    env.update({k: os.environ[k] for k in ("ZSPEED_DEVICE", "ZSPEED_DIST_BACKEND") if k in os.environ})
    # One rank is a process started by hand (no launcher variables), several a torchrun-like job.
    res = run_ranks(n, WORKER, env=env, timeout=300)
    for r in res:
        assert r.returncode == 0, r
    return [torch.load(f"{out}.{r}.pt") for r in range(n)]


def _close(a, b, rtol, atol):
    for k in a["state"]:
        torch.testing.assert_close(a["state"][k], b["state"][k], rtol=rtol, atol=atol, msg=k)


CASES = [  # (stage, offload device, precision, gas)
    (0, "none", "fp32", 1), (1, "none", "fp32", 2), (2, "none", "fp32", 1), (2, "none", "bf16", 1),
    (1, "cpu", "fp32", 1), (2, "cpu", "fp32", 2), (2, "cpu", "bf16", 1), (2, "nvme", "fp32", 1),
]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("stage,device,precision,gas", CASES)
def test_ranks_match_one_process(tmp_path, n, stage, device, precision, gas):
    mb = 6 // n // gas if 6 % (n * gas) == 0 else None
    if mb is None:
        pytest.skip(f"6 samples do not split into {n} ranks x {gas} micro-batches")
    ref = _run(1, _cfg(max(stage, 1) if device != "none" else stage, device, precision, gas, clip=0.5,
                       mb=6 // gas, tmp=tmp_path), tmp_path, "ref", groups=True)[0]
    outs = _run(n, _cfg(stage, device, precision, gas, clip=0.5, mb=mb, tmp=tmp_path), tmp_path, "dp",
                groups=True)
    tol = (1e-5, 1e-6) if precision == "fp32" else (2e-2, 2e-2)
    ntol = 1e-5 if precision == "fp32" else 2e-2  # bf16 gradients are summed in bf16
    for o in outs:
        _close(o, ref, *tol)
        assert o["ranks"][2] == n
        for x, y in zip(o["norms"], ref["norms"]):
            assert (x is None) == (y is None) and (x is None or abs(x - y) <= ntol * max(1.0, y))
    for o in outs[1:]:  # every rank holds the same model, bit for bit
        for k in o["state"]:
            assert torch.equal(o["state"][k], outs[0]["state"][k]), k


def test_fp16_overflow_on_one_rank_skips_the_step_everywhere(tmp_path):
    outs = _run(2, _cfg(2, "cpu", "fp16", mb=3, tmp=tmp_path), tmp_path, "fp16", inf_at=[2])
    for o in outs:
        # hysteresis 2 (the default): the first overflow skips the step without lowering the scale
        assert o["applied"][2] is False and o["skipped"] == 1 and o["loss_scale"] == 2.0 ** 8
        assert sum(1 for a in o["applied"] if a) == 5
    for k in outs[0]["state"]:
        assert torch.equal(outs[0]["state"][k], outs[1]["state"][k])


def test_tied_embeddings_and_lm(tmp_path):
    ref = _run(1, _cfg(2, "cpu", mb=8), tmp_path, "lmref", model="lm")[0]
    outs = _run(2, _cfg(2, "cpu", mb=4), tmp_path, "lm", model="lm")
    for o in outs:
        _close(o, ref, 1e-5, 1e-6)


@pytest.mark.parametrize("stage,precision,model,mb", [(1, "fp32", "mlp", 3), (2, "bf16", "mlp", 3),
                                                     (2, "fp32", "lm", 4)])
def test_overlap_forward_on_ranks_equals_the_synchronous_step(tmp_path, stage, precision, model, mb):
    """offload_optimizer.overlap_forward with 2 ranks: each unit is all-gathered from the
    background step (its own process group) once this rank's shard of it is stepped, and the
    next forward waits per module for its units. The CPU step is slowed down so the forward
    runs ahead; the result must equal the synchronous step's bit for bit."""
    def cfg(overlap):
        c = _cfg(stage, "cpu", precision, clip=0.5, mb=mb)
        c["zero_optimization"].update(reduce_bucket_size=300, sub_group_size=150)  # several units, chunks
        c["zero_optimization"]["offload_optimizer"]["overlap_forward"] = overlap
        return c
    kw = dict(model=model, groups=model == "mlp")
    ref = _run(2, cfg(False), tmp_path, "sync", **kw)
    got = _run(2, cfg(True), tmp_path, "overlap", slow_step=0.02, **kw)
    for a, b in zip(ref, got):
        assert a["norms"] == b["norms"]
        for k in a["state"]:
            assert torch.equal(a["state"][k], b["state"][k]), k


SUM_OP = r"""
import torch, zspeed
zspeed.init_distributed()
r = zspeed.comm.get_rank()

def run(stage, op, lr):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(7, 19), torch.nn.Tanh(), torch.nn.Linear(19, 3))
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "zero_allow_untested_optimizer": True, "gradient_allreduce_op": op,
           "gradient_clipping": 0}  # sum == 2 * mean holds for the unclipped gradients
    e, *_ = zspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=lr), config=cfg)
    g = torch.Generator().manual_seed(3 + r)  # each rank its own data
    for _ in range(3):
        e.backward(e(torch.randn(2, 7, generator=g)).pow(2).mean())
        e.step()
    return [p.detach().clone() for p in m.parameters()]

for stage in (0, 1, 2):
    # SGD without momentum: the sum over 2 ranks at lr is the mean at 2 lr, bit for bit (the
    # mean's factor 1/2 and the doubled lr are exact)
    a, b = run(stage, "SUM", 0.01), run(stage, "mean", 0.02)
    c = run(stage, "Mean", 0.01)
    print(stage, "sum==mean*2", all(torch.equal(x, y) for x, y in zip(a, b)),
          "differs", not all(torch.equal(x, y) for x, y in zip(a, c)))
try:
    run(3, "sum", 0.01)
except zspeed.ConfigError as e:
    print("stage3", e)
"""


LOCAL_BACKWARDS = r"""
import torch, zspeed
zspeed.init_distributed()
r = zspeed.comm.get_rank()

def run(stage, how):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(7, 19), torch.nn.Tanh(), torch.nn.Linear(19, 3))
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    if how == "gas":
        cfg["gradient_accumulation_steps"] = 3
    e, *_ = zspeed.initialize(model=m, config=cfg)
    g = torch.Generator().manual_seed(3 + r)  # each rank its own data
    for _ in range(2):
        xs = [torch.randn(2, 7, generator=g) for _ in range(3)]
        loss = lambda x: e(x).pow(2).mean() / (3 if how != "gas" else 1)  # the same sum of gradients
        if how == "gas":
            for x in xs:
                e.backward(e(x).pow(2).mean())
                e.step()
        elif how == "coalesce":
            with e.coalesce_grad_reduction():
                for x in xs:
                    e.backward(loss(x))
            e.step()
        elif how == "no_sync":
            with e.no_sync():
                for x in xs[:2]:
                    e.backward(loss(x))
            e.backward(loss(xs[2]))
            e.step()
        else:  # accelerate's way
            for i, x in enumerate(xs):
                e.set_gradient_accumulation_boundary(i == 2)
                e.backward(loss(x))
            e.step()
    return [p.detach().clone() for p in m.parameters()], e.global_steps

for stage in (0, 1, 2, 3):
    ref, n = run(stage, "boundary")
    kinds = ["coalesce"] * (stage > 0) + ["no_sync"] * (stage < 2)
    for how in kinds:
        got, k = run(stage, how)
        print(stage, how, "equal", all(torch.equal(a, b) for a, b in zip(ref, got)), "steps", n, k)
    gas, _ = run(stage, "gas")
    print(stage, "gas close", all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ref, gas)))
"""


def test_coalesce_grad_reduction_and_no_sync_on_two_ranks_equal_the_boundary_flags():
    """DeepSpeed's engine.coalesce_grad_reduction() (stages 1-3) and engine.no_sync() (stages 0-1):
    the backwards inside keep their gradients on each rank and one reduction serves the step, so
    the weights equal those of set_gradient_accumulation_boundary(False) before all but the last
    micro-batch, bit for bit (the same gradient sum reduced once), and gradient accumulation over
    the same micro-batches to fp32 rounding (its division by 3 comes at another point)."""
    res = run_ranks(2, LOCAL_BACKWARDS, timeout=300)
    for r in res:
        assert r.returncode == 0, r
    for r in res:
        for stage in (0, 1, 2, 3):
            kinds = ["coalesce"] * (stage > 0) + ["no_sync"] * (stage < 2)
            for how in kinds:
                assert f"{stage} {how} equal True steps 2 2" in r.stdout, r.stdout
            assert f"{stage} gas close True" in r.stdout, r.stdout


def test_gradient_allreduce_op_sum_keeps_the_unscaled_sum():
    """DeepSpeed's gradient_allreduce_op: "mean" (default) averages over the ranks, "sum" keeps
    the sum (stages 0-2; ZeRO-3 refuses it, as DeepSpeed's does); any letter case."""
    res = run_ranks(2, SUM_OP, timeout=240)
    for r in res:
        assert r.returncode == 0, r
    for r in res:
        for stage in (0, 1, 2):
            assert f"{stage} sum==mean*2 True differs True" in r.stdout, r.stdout
        assert 'stage3 gradient_allreduce_op "sum" is not supported with ZeRO stage 3: it runs at stage 0, 1 or 2 (as in DeepSpeed' in r.stdout, r.stdout


def test_ranks_that_disagree_fail_fast_naming_the_rank():
    res = run_ranks(2, """
        import torch, zspeed
        zspeed.init_distributed()
        r = zspeed.comm.get_rank()
        model = torch.nn.Linear(5, 3 if r == 0 else 4)
        try:
            zspeed.initialize(model=model, config={"train_batch_size": 4, "zero_optimization": {"stage": 2},
                                                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
        except zspeed.ConfigError as e:
            print("ERR", e)
    """, timeout=120)
    for r in res:
        assert r.returncode == 0, r
    assert "ERR rank 1 differs from rank 0 in its parameters" in res[0].stdout, res[0].stdout
    assert "(4, 5)" in res[0].stdout and "(3, 5)" in res[0].stdout


def test_a_killed_rank_stops_the_others_with_a_clear_error():
    res = run_ranks(2, """
        import os, signal, time, torch, zspeed
        zspeed.init_distributed()
        r = zspeed.comm.get_rank()
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))
        e, *_ = zspeed.initialize(model=model, config={"train_micro_batch_size_per_gpu": 4,
            "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
        for i in range(100000):
            if r == 1 and i == 20:
                os.kill(os.getpid(), getattr(signal, 'SIGKILL', 9))
            loss = e(torch.randn(4, 64)).square().mean()
            e.backward(loss)
            e.step()
    """, timeout=240, env={"DEEPSPEED_TIMEOUT": "1"})
    assert res[1].returncode == KILLED
    assert res[0].returncode not in (0, "timeout"), res[0]
    assert "DistributedError" in res[0].stderr and "rank 0 of 2" in res[0].stderr, res[0].stderr[-3000:]


@pytest.mark.parametrize("overlap,where", [(False, "engine.backward()"), (True, "engine.backward()")])
def test_a_rank_killed_during_a_zero3_backward_ends_the_other_in_a_distributed_error(overlap, where):
    """Stage 3 reduces each unit during backward: the peer's death inside it must surface as the
    DistributedError (it was a bare KeyError from the cleanup reissuing the failed unit), in
    backward, also with overlap_comm (stage 3's default), whose reductions are waited for at the
    end of backward (every reduced shard is in place when backward returns, as DeepSpeed's)."""
    res = run_ranks(2, """
        import os, signal, torch, zspeed
        zspeed.init_distributed()
        r = zspeed.comm.get_rank()
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                                    torch.nn.Linear(64, 1))
        e, *_ = zspeed.initialize(model=model, config={"train_micro_batch_size_per_gpu": 4,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "overlap_comm": OVERLAP},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
        step = [0]
        def die(module, grad_in, grad_out):
            if r == 1 and step[0] == 3:
                os.kill(os.getpid(), getattr(signal, 'SIGKILL', 9))
        model[2].register_full_backward_hook(die)
        for i in range(100000):
            step[0] = i
            loss = e(torch.randn(4, 64)).square().mean()
            e.backward(loss)
            e.step()
    """.replace("OVERLAP", repr(overlap)), timeout=240, env={"DEEPSPEED_TIMEOUT": "1"})
    assert res[1].returncode == KILLED
    assert res[0].returncode not in (0, "timeout"), res[0]
    err = res[0].stderr
    assert "DistributedError" in err and where in err, err[-3000:]
    assert "KeyError" not in err, err[-3000:]


def test_a_rank_killed_during_an_overlapped_step_ends_the_other_in_a_distributed_error():
    """overlap_forward with 2 ranks: the all-gathers run in the step's own thread; a peer killed
    meanwhile must end the survivor with the DistributedError, not a raw Gloo error."""
    import time
    t0 = time.monotonic()
    res = run_ranks(2, """
        import os, signal, time, torch, zspeed
        zspeed.init_distributed()
        r = zspeed.comm.get_rank()
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
        e, *_ = zspeed.initialize(model=model, config={"train_micro_batch_size_per_gpu": 4,
            "zero_optimization": {"stage": 2, "reduce_bucket_size": 1000, "sub_group_size": 1000,
                                  "offload_optimizer": {"device": "cpu", "overlap_forward": True}},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
        for i in range(100000):
            if r == 1 and i == 5:
                os.kill(os.getpid(), getattr(signal, 'SIGKILL', 9))
            loss = e(torch.randn(4, 64)).square().mean()
            e.backward(loss)
            e.step()
    """, timeout=240, env={"DEEPSPEED_TIMEOUT": "1"})
    took = time.monotonic() - t0
    assert res[1].returncode == KILLED
    assert res[0].returncode not in (0, "timeout"), res[0]
    err = res[0].stderr
    assert "DistributedError" in err and "rank 0 of 2" in err, err[-3000:]
    print(f"the survivor stopped after {took:.1f} s")


@pytest.mark.skipif(os.name == "nt", reason="torch's Windows wheels (2.15) cannot start plain torchrun: its rendezvous "
                    "creates a TCPStore with use_libuv=True in a build without libuv; `zspeed launch` works around "
                    "it (test_launch.py)")
def test_torchrun_launches_the_example(tmp_path):
    """The DeepSpeed-style example under torchrun: 2 ranks, ZeRO-2 + CPU offload, on the CPU."""
    root = os.path.dirname(os.path.dirname(HERE))
    from distrun import free_port
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    env.update(ZSPEED_DEVICE="cpu", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port()), os.path.join(root, "examples", "data_parallel.py"),
                        "--deepspeed_config", os.path.join(root, "examples", "zero2_offload.json"),
                        "--epochs", "1"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epoch 0: mean loss" in r.stdout and "2 rank(s)" in r.stdout
    assert r.stdout.count("epoch 0") == 1  # only rank 0 reports


def test_a_call_only_one_rank_makes_is_said_while_waiting_and_named_when_it_fails():
    """Rank 0 alone enters GatheredParameters between backward and step (issue 52 #12): both ranks
    say within seconds that they wait in a collective and why that happens, and the timeout ends
    in DistributedErrors naming the call and the rule, not a raw backend error after minutes
    of silence."""
    res = run_ranks(2, """
        import torch, zspeed
        zspeed.init_distributed()
        r = zspeed.comm.get_rank()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        e, *_ = zspeed.initialize(model=model, config={"train_micro_batch_size_per_gpu": 2,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
        e.backward(e(torch.randn(2, 16)).square().mean())
        if r == 0:
            with zspeed.zero.GatheredParameters(list(e.module.parameters())):
                pass
        e.step()
    """, env={"DEEPSPEED_TIMEOUT": "0.25", "ZSPEED_COLLECTIVE_WARN_S": "2"}, timeout=180, fresh=True)
    for r in res:
        assert r.returncode not in (0, "timeout"), r
        assert f"rank {r.rank} of 2 has waited" in r.stderr and "same zspeed calls in the same order" in r.stderr, \
            r.stderr[-3000:]
        assert "DistributedError" in r.stderr, r.stderr[-3000:]
    assert "a collective of GatheredParameters (entering the context) failed" in res[0].stderr, res[0].stderr[-3000:]
    assert "a collective in engine.step() failed" in res[1].stderr, res[1].stderr[-3000:]
