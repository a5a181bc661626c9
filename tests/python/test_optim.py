"""zspeed.ops optimizers: the numpy API without torch, and CPUAdam /
CPUAdagrad / CPULion against torch.optim over 100 steps.

Run: ZSPEED_LIBRARY=$PWD/build/libzspeed.so PYTHONPATH=$PWD/python \
     python -m pytest tests/python/test_optim.py
"""
import copy
import os
import subprocess
import sys

import numpy as np
import pytest

import zspeed.ops as ops
from zspeed import NativeError
from zspeed.ops.adagrad import adagrad_step
from zspeed.ops.adam import adam_step
from zspeed.ops.lion import lion_step

torch = pytest.importorskip("torch", reason="torch is needed for the "
                            "torch.optim comparisons")


# ------------------------------------------------------------- no torch

def test_ops_imports_without_torch():
    code = ("import sys, zspeed.ops, zspeed.ops.adam, zspeed.ops.adagrad, "
            "zspeed.ops.lion; assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, env=os.environ.copy())
    assert r.returncode == 0, r.stderr


def _adam_ref64(p, g, m, v, t, lr, b1, b2, eps, wd, adamw):
    """float64 reference of one torch AdamW/Adam step."""
    if not adamw:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    if adamw:
        p = p * (1 - lr * wd)
    p = p - lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
    return p, m, v


@pytest.mark.parametrize("adamw", [True, False])
@pytest.mark.parametrize("n", [1, 17, 1023, 100003])
def test_numpy_adam_vs_float64(adamw, n):
    rng = np.random.default_rng(n)
    p = rng.standard_normal(n).astype(np.float32)
    m = np.zeros(n, np.float32)
    v = np.zeros(n, np.float32)
    pr, mr, vr = p.astype(np.float64), np.zeros(n), np.zeros(n)
    for t in range(1, 21):
        g = rng.standard_normal(n).astype(np.float32)
        adam_step(p, g, m, v, step=t, lr=1e-2, weight_decay=0.05,
                  adamw_mode=adamw, num_threads=2)
        pr, mr, vr = _adam_ref64(pr, g.astype(np.float64), mr, vr, t, 1e-2, 0.9,
                                 0.999, 1e-8, 0.05, adamw)
    # fp32 arithmetic over 20 steps of size <= ~lr: drift of a few fp32 ulps
    # of |p| (~1) per step.
    np.testing.assert_allclose(p, pr, rtol=0, atol=2e-5)
    np.testing.assert_allclose(v, vr, rtol=1e-5, atol=1e-9)


def test_numpy_out_and_bf16_bits():
    rng = np.random.default_rng(1)
    n = 1001
    p = rng.standard_normal(n).astype(np.float32)
    g32 = rng.standard_normal(n).astype(np.float32)
    # bf16 grads as uint16 bit patterns (the top half of the fp32 bits).
    gbf = (g32.view(np.uint32) >> 16).astype(np.uint16)
    out = np.zeros(n, np.float16)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    adam_step(p, gbf, m, v, step=1, lr=1e-3, out=out)
    np.testing.assert_array_equal(out, p.astype(np.float16))
    # m = 0.1 * g with g the truncated bf16 value.
    gt = (gbf.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(m, 0.1 * gt, rtol=1e-6)


def test_numpy_errors_modify_nothing():
    n = 64
    p = np.ones(n, np.float32)
    g = np.ones(n, np.float32)
    m = np.zeros(n, np.float32)
    with pytest.raises(NativeError, match="overlap") as e:
        adam_step(p, g, m, m, step=1)
    assert e.value.name == "ZS_EOVERLAP"
    assert (p == 1).all() and (m == 0).all()
    ro = np.ones(n, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        adam_step(ro, g, m, np.zeros(n, np.float32), step=1)
    with pytest.raises(ValueError, match="elements"):
        adam_step(p, g[:10], m, np.zeros(n, np.float32), step=1)
    with pytest.raises(TypeError, match="dtype float64"):
        adam_step(p, g.astype(np.float64), m, np.zeros(n, np.float32), step=1)
    with pytest.raises(NativeError) as e:
        adam_step(p, g, m, np.zeros(n, np.float32), step=0)
    assert e.value.name == "ZS_EINVAL" and "step" in str(e.value)
    with pytest.raises(NativeError) as e:
        adagrad_step(p, g, m, lr_decay=0.5)
    assert e.value.name == "ZS_ENOTSUP"
    assert (p == 1).all() and (m == 0).all()


def test_numpy_misaligned_refused():
    n = 32
    raw = bytearray(4 * n + 4)
    mis = np.frombuffer(raw, dtype=np.float32, count=n, offset=2)
    assert not mis.flags["ALIGNED"]
    g = np.ones(n, np.float32)
    with pytest.raises(NativeError) as e:
        adam_step(mis, g, np.zeros(n, np.float32), np.zeros(n, np.float32), step=1)
    assert e.value.name == "ZS_EALIGN"
    assert bytes(raw) == bytes(4 * n + 4)


def test_q8_conversions_and_int8_numpy_step():
    from zspeed.ops.adam import q8_dequantize, q8_quantize
    rng = np.random.default_rng(4)
    n = 1000
    nb = ops.qblocks(n)
    m = (rng.standard_normal(n) * 0.1).astype(np.float32)
    v = rng.random(n).astype(np.float32)
    cm, cv = np.zeros(n, np.int8), np.zeros(n, np.uint8)
    sm, sv = np.zeros(nb, np.float32), np.zeros(nb, np.float32)
    q8_quantize(m, v, cm, sm, cv, sv)
    m2, v2 = np.empty_like(m), np.empty_like(v)
    q8_dequantize(cm, sm, cv, sv, m2, v2)
    # Square maps: error <= block max * (2 t d + d^2), d = half a code step;
    # bounded here by the worst case t = 1.
    for b in range(nb):
        s = slice(256 * b, 256 * (b + 1))
        assert np.abs(m2[s] - m[s]).max() <= sm[b] * (2 / 127 * 0.5 + 1e-4) * 1.01
        assert np.abs(np.sqrt(v2[s]) - np.sqrt(v[s])).max() <= sv[b] * (1 / 255 + 1e-4) * 1.01
    with pytest.raises(ValueError, match="scales"):
        q8_quantize(m, v, cm, sm[:-1], cv, sv)
    # A numpy step on 8-bit states moves the params like an fp32-state step.
    p = rng.standard_normal(n).astype(np.float32)
    p32 = p.copy()
    g = rng.standard_normal(n).astype(np.float32)
    adam_step(p, g, cm, cv, step=1, lr=1e-2, exp_avg_scale=sm, exp_avg_sq_scale=sv)
    adam_step(p32, g, m2, v2, step=1, lr=1e-2)
    assert np.abs(p - p32).max() < 1e-2  # one step of size <= ~lr each
    with pytest.raises(TypeError, match="uint8"):
        adam_step(p, g, cm, cm.view(np.int8), step=2, exp_avg_scale=sm,
                  exp_avg_sq_scale=sv)


def test_grad_stats():
    rng = np.random.default_rng(3)
    a = rng.standard_normal(100003).astype(np.float32)
    b = torch.randn(777, dtype=torch.bfloat16)
    c = torch.randn(5, dtype=torch.float16)
    s, nf = ops.grad_stats([a, b, c], scale=0.5, num_threads=2)
    want = sum(float(np.sum((x.astype(np.float32) * np.float32(0.5)).astype(np.float64) ** 2))
               for x in (a, b.float().numpy(), c.float().numpy()))
    assert not nf
    # Exact squares summed in float64: relative error ~ n * 2^-53.
    assert abs(s - want) <= 1e-10 * want
    s1, _ = ops.grad_stats([a, b, c], scale=0.5, num_threads=1)
    assert s1 == s  # deterministic for any thread count
    c[3] = float("inf")
    s, nf = ops.grad_stats([a, b, c])
    assert nf and s == float("inf")
    b[0] = float("nan")
    assert ops.grad_stats([b])[1]


# ------------------------------------------------------------- vs torch

def _model_params(seed, shapes=((37, 5), (129,), (3, 3, 3))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


def _run_pair(make_ours, make_ref, steps=100, seed=0, lr_schedule=None,
              grad_dtype=None):
    base = _model_params(seed)
    ours = [p.clone().requires_grad_() for p in base]
    ref = [p.clone().requires_grad_() for p in base]
    o1 = make_ours([{"params": ours[:2]}, {"params": ours[2:], "lr": 3e-3}])
    o2 = make_ref([{"params": ref[:2]}, {"params": ref[2:], "lr": 3e-3}])
    gen = torch.Generator().manual_seed(seed + 1)
    for t in range(steps):
        if lr_schedule:
            for o in (o1, o2):
                for grp in o.param_groups:
                    grp["lr"] = lr_schedule(t, grp)
        for a, b in zip(ours, ref):
            g = torch.randn(a.shape, generator=gen)
            a.grad, b.grad = g.clone(), g.clone()
        o1.step()
        o2.step()
        o1.zero_grad()
        o2.zero_grad()
        assert all(p.grad is None for p in ours)  # zero_grad sets to None
    return ours, ref, o1, o2


# fp32 over 100 steps: both sides compute in fp32 with slightly different
# operation orders (torch uses lerp and a divide by sqrt(bc2)); the drift
# stays at a few ulps of |p| ~ 1 per step.
TOL = dict(rtol=0, atol=2e-5)


@pytest.mark.parametrize("adamw", [True, False])
def test_cpuadam_vs_torch(adamw):
    from zspeed.ops.adam import CPUAdam
    ref_cls = torch.optim.AdamW if adamw else torch.optim.Adam
    ours, ref, o1, o2 = _run_pair(
        lambda ps: CPUAdam(ps, lr=1e-2, weight_decay=0.1, adamw_mode=adamw,
                           num_threads=2),
        lambda ps: ref_cls(ps, lr=1e-2, weight_decay=0.1))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **TOL)
        torch.testing.assert_close(o1.state[a]["exp_avg_sq"], o2.state[b]["exp_avg_sq"],
                                   rtol=1e-5, atol=1e-8)
    assert o1.state[ours[0]]["step"] == 100


def test_cpuadam_lr_changes_between_steps():
    from zspeed.ops.adam import CPUAdam
    sched = lambda t, grp: 1e-2 * (0.97 ** t)  # noqa: E731
    ours, ref, _, _ = _run_pair(lambda ps: CPUAdam(ps, lr=1e-2),
                                lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0),
                                lr_schedule=sched)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **TOL)


def test_cpuadam_no_bias_correction_matches_formula():
    from zspeed.ops.adam import CPUAdam
    p = torch.randn(100)
    q = p.clone()
    opt = CPUAdam([q], lr=0.1, bias_correction=False)
    g = torch.randn(100)
    q.grad = g.clone()
    opt.step()
    m, v = 0.1 * g, 0.001 * g * g
    torch.testing.assert_close(q, p - 0.1 * m / (v.sqrt() + 1e-8), rtol=1e-6, atol=1e-6)


def test_cpuadagrad_vs_torch():
    from zspeed.ops.adagrad import CPUAdagrad
    ours, ref, o1, o2 = _run_pair(
        lambda ps: CPUAdagrad(ps, lr=1e-2, weight_decay=0.01,
                              initial_accumulator_value=0.1, eps=1e-10),
        lambda ps: torch.optim.Adagrad(ps, lr=1e-2, weight_decay=0.01,
                                       initial_accumulator_value=0.1, eps=1e-10))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **TOL)
        torch.testing.assert_close(o1.state[a]["sum"], o2.state[b]["sum"],
                                   rtol=1e-5, atol=1e-6)


class _TorchLion(torch.optim.Optimizer):
    """Reference Lion in plain torch (the lion-pytorch update rule)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for grp in self.param_groups:
            b1, b2 = grp["betas"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(p)
                m = st["exp_avg"]
                p.mul_(1 - grp["lr"] * grp["weight_decay"])
                p.add_((m * b1 + p.grad * (1 - b1)).sign_(), alpha=-grp["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def test_cpulion_vs_reference():
    from zspeed.ops.lion import CPULion
    ours, ref, _, _ = _run_pair(lambda ps: CPULion(ps, lr=1e-3, weight_decay=0.1),
                                lambda ps: _TorchLion(ps, lr=1e-3, weight_decay=0.1))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **TOL)


# ------------------------------------------------ mixed precision inputs

def test_bf16_grads_scale_and_copy_out():
    """grads= (bf16, as torch forbids on an fp32 param), grad_scale and the
    fp16_param_groups copy-out, against torch AdamW on the upcast grads."""
    from zspeed.ops.adam import CPUAdam
    base = _model_params(5)
    ours = [p.clone() for p in base]
    ref = [p.clone().requires_grad_() for p in base]
    outs = [torch.empty(p.shape, dtype=torch.bfloat16) for p in base]
    o1 = CPUAdam(ours, lr=1e-2)
    o2 = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0)
    for _ in range(10):
        gs = [(torch.randn(p.shape) * 1024).to(torch.bfloat16) for p in base]
        o1.step(grads=[gs], grad_scale=1 / 1024, fp16_param_groups=[outs])
        for r, g in zip(ref, gs):
            r.grad = g.float() / 1024
        o2.step()
    for a, b, o in zip(ours, ref, outs):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=2e-5)
        assert torch.equal(o, a.to(torch.bfloat16))


def test_bf16_params_updated_in_place_and_skips():
    from zspeed.ops.adam import CPUAdam
    p = torch.randn(300).to(torch.bfloat16)
    keep = torch.randn(10)
    p0 = p.clone()
    opt = CPUAdam([p, keep], lr=1e-2)
    p.grad = torch.randn(300).to(torch.bfloat16)
    before = keep.clone()
    opt.step()  # keep has no grad: skipped, no state
    assert torch.equal(keep, before) and len(opt.state[keep]) == 0
    ref = p0.float() - 1e-2 * torch.sign(p.grad.float())  # first Adam step ~ lr*sign
    torch.testing.assert_close(p.float(), ref.to(torch.bfloat16).float(),
                               rtol=0, atol=2 ** -7 * 4)


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_state_dict_round_trip(state_dtype):
    from zspeed.ops.adam import CPUAdam

    def grads(t):
        gen = torch.Generator().manual_seed(100 + t)
        return [torch.randn(p.shape, generator=gen) for p in _model_params(7)]

    def run(opt, params, t0, t1):
        for t in range(t0, t1):
            for p, g in zip(params, grads(t)):
                p.grad = g
            opt.step()

    full = [p.clone() for p in _model_params(7)]
    o_full = CPUAdam(full, lr=1e-2, state_dtype=state_dtype)
    run(o_full, full, 0, 10)

    half = [p.clone() for p in _model_params(7)]
    o_half = CPUAdam(half, lr=1e-2, state_dtype=state_dtype)
    run(o_half, half, 0, 5)
    sd = o_half.state_dict()
    resumed = [p.clone() for p in half]
    o_res = CPUAdam(resumed, lr=5.0, state_dtype=state_dtype)
    o_res.load_state_dict(sd)
    assert o_res.param_groups[0]["lr"] == 1e-2
    st = o_res.state[resumed[0]]
    want = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}
    assert st["exp_avg"].dtype == want[state_dtype]
    if state_dtype == "int8":
        assert st["exp_avg_sq"].dtype == torch.uint8
        assert st["exp_avg_scale"].dtype == torch.float32
    run(o_res, resumed, 5, 10)
    for a, b in zip(full, resumed):
        assert torch.equal(a, b)  # bit-identical continuation


def test_torch_errors():
    from zspeed.ops.adagrad import CPUAdagrad
    from zspeed.ops.adam import CPUAdam
    p = torch.randn(10)
    with pytest.raises(ValueError, match="amsgrad"):
        CPUAdam([p], amsgrad=True)
    with pytest.raises(ValueError, match="state_dtype"):
        CPUAdam([p], state_dtype="fp8")
    with pytest.raises(ValueError, match="lr_decay"):
        CPUAdagrad([p], lr_decay=0.1)
    opt = CPUAdam([p])
    with pytest.raises(ValueError, match="elements"):
        opt.step(grads=[[torch.randn(11)]])
    with pytest.raises(ValueError, match="per param"):
        opt.step(grads=[[]])
    with pytest.raises(TypeError, match="dtype"):
        opt.step(grads=[[torch.randn(10, dtype=torch.float64)]])
    with pytest.raises(ValueError, match="contiguous"):
        CPUAdam([torch.randn(4, 4).t()]).step(grads=[[torch.randn(16)]])


# ------------------------------------------------ 8-bit states: training

def test_int8_states_train_mlp_like_fp32():
    """A 2-layer MLP regressing a fixed random teacher, 400 AdamW steps on
    mini-batches. With 8-bit states the final loss must be within 15% of the
    fp32-state run, and both must have cut the loss by at least 10x."""
    from zspeed.ops.adam import CPUAdam

    def train(state_dtype):
        torch.manual_seed(0)
        teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                      torch.nn.Linear(64, 4))
        student = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                      torch.nn.Linear(128, 4))
        opt = CPUAdam(student.parameters(), lr=3e-3, weight_decay=0.01,
                      state_dtype=state_dtype)
        gen = torch.Generator().manual_seed(1)
        xs = torch.randn(4096, 32, generator=gen)
        with torch.no_grad():
            ys = teacher(xs)
        first = None
        for step in range(400):
            idx = torch.randint(0, 4096, (128,), generator=gen)
            loss = torch.nn.functional.mse_loss(student(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = first if first is not None else loss.item()
        with torch.no_grad():
            return first, torch.nn.functional.mse_loss(student(xs), ys).item()

    f0, l32 = train("fp32")
    _, l8 = train("int8")
    _, lbf = train("bf16")
    assert l32 < f0 / 10, (f0, l32)
    assert l8 <= 1.15 * l32, (l8, l32)
    assert lbf <= 1.15 * l32, (lbf, l32)


def test_buffers_other_than_numpy():
    """ctypes arrays, memoryviews and array.array step exactly like numpy
    arrays of the same type (format 'f' is fp32, 'H' bf16 bits); read-only
    memory is refused where the kernel writes."""
    import array
    import ctypes
    rng = np.random.default_rng(12)
    n = 37
    p = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    gb = (g.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits (truncated)
    ref = [p.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)]
    adam_step(*ref[:1], gb, *ref[1:], step=1, lr=1e-2)
    pc = (ctypes.c_float * n)(*p)
    mc, vc = (ctypes.c_float * n)(), memoryview(bytearray(4 * n)).cast("f")
    adam_step(pc, array.array("H", gb.tobytes()), mc, vc, step=1, lr=1e-2)
    assert bytes(pc) == ref[0].tobytes()
    assert bytes(mc) == ref[1].tobytes() and vc.tobytes() == ref[2].tobytes()
    frozen = memoryview(p.tobytes()).cast("f")
    with pytest.raises(ValueError, match="param is read-only"):
        adam_step(frozen, g, np.zeros(n, np.float32), np.zeros(n, np.float32), step=1)
    with pytest.raises(TypeError, match="dtype uint8"):
        adam_step(p.copy(), g.tobytes(), np.zeros(n, np.float32),
                  np.zeros(n, np.float32), step=1)


def test_client_as_config_names_each_cpu_class_and_refuses_others():
    """The NVMe path and the split rebuild a native client optimizer from its defaults: each of
    zspeed's CPU classes maps to its own algorithm (none falls through to another's), and any
    other class is a TypeError, not a silent Lion."""
    from zspeed.ops._torch_optim import CPUAdagrad, CPUAdam, CPULion
    from zspeed.runtime.optimizers import client_as_config
    p = [torch.nn.Parameter(torch.zeros(3))]
    assert client_as_config(CPUAdam(p, lr=0.1, adamw_mode=True))[0] == "AdamW"
    assert client_as_config(CPUAdam(p, lr=0.1, adamw_mode=False))[0] == "Adam"
    assert client_as_config(CPUAdagrad(p, lr=0.1))[0] == "Adagrad"
    name, params = client_as_config(CPULion(p, lr=0.1, betas=(0.8, 0.9)))
    assert (name, params["betas"], params["lr"]) == ("Lion", [0.8, 0.9], 0.1)
    with pytest.raises(TypeError, match="SGD is not one of zspeed's CPU optimizer classes"):
        client_as_config(torch.optim.SGD(p, lr=0.1))


def _end_to_end(sizes, dtype=torch.float32, seed=0):
    """Views of one flat tensor, of ``sizes`` elements each (as zspeed's host buffers lay out
    parameters), and the flat tensor."""
    flat = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(seed)).to(dtype)
    views, at = [], 0
    for n in sizes:
        views.append(flat[at:at + n])
        at += n
    return flat, views


_FUSE_CASES = [
    ("adam", lambda ps: __import__("zspeed.ops.adam", fromlist=["CPUAdam"]).CPUAdam(
        ps, lr=1e-2, weight_decay=0.1, num_threads=2)),
    ("adam_bf16_state", lambda ps: __import__("zspeed.ops.adam", fromlist=["CPUAdam"]).CPUAdam(
        ps, lr=1e-2, state_dtype="bf16", adamw_mode=False, num_threads=2)),
    ("adam_int8_state", lambda ps: __import__("zspeed.ops.adam", fromlist=["CPUAdam"]).CPUAdam(
        ps, lr=1e-2, state_dtype="int8", num_threads=2)),
    ("adagrad", lambda ps: __import__("zspeed.ops.adagrad", fromlist=["CPUAdagrad"]).CPUAdagrad(
        ps, lr=1e-2, initial_accumulator_value=0.1)),
    ("lion", lambda ps: __import__("zspeed.ops.lion", fromlist=["CPULion"]).CPULion(
        ps, lr=1e-3, weight_decay=0.1)),
]


@pytest.mark.parametrize("name,make", _FUSE_CASES, ids=[c[0] for c in _FUSE_CASES])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16])
def test_flattened_states_step_runs_of_parameters_bit_for_bit(name, make, out_dtype, monkeypatch):
    """flatten_states() lays each group's states end to end; step() then runs consecutive
    parameters whose masters, gradients, outputs and states lie end to end as one kernel call.
    The result equals one call per parameter bit for bit (difference exactly 0: the kernels
    are elementwise), over steps where a parameter in the middle has no gradient (the run
    breaks there) and across a state_dict round trip, which keeps the states end to end."""
    from zspeed.ops import _kernels
    sizes = [37, 1, 129, 1000, 3, 517, 64]  # odd sizes, a one-element parameter
    two_groups = lambda ps: [{"params": ps[:4]}, {"params": ps[4:], "lr": 3e-3}]  # noqa: E731
    _, ref_ps = _end_to_end(sizes)
    flat, ps = _end_to_end(sizes)
    ref, opt = make(two_groups(ref_ps)), make(two_groups(ps))
    opt.flatten_states()
    kernel = {"adam": "adam", "adagrad": "adagrad", "lion": "lion"}[name.split("_")[0]]
    calls = []
    real = getattr(_kernels, kernel)
    monkeypatch.setattr(_kernels, kernel, lambda *a, **k: calls.append(a[0].numel()) or real(*a, **k))
    for step in range(4):
        g_flat, gs = _end_to_end(sizes, seed=10 + step)
        if step == 2:
            gs[5] = None  # no gradient this step: skipped, the run breaks around it
        outs = None if out_dtype is None else [[torch.zeros(n, dtype=out_dtype) for n in sizes[:4]],
                                               [torch.zeros(n, dtype=out_dtype) for n in sizes[4:]]]
        out_flat = None
        if out_dtype is not None:
            out_flat, ov = _end_to_end(sizes, out_dtype)
            out_flat.zero_()
            outs_fused = [ov[:4], ov[4:]]
        calls.clear()
        ref.step(grads=[[g.clone() if g is not None else None for g in gs[:4]],
                        [g.clone() if g is not None else None for g in gs[4:]]], grad_scale=0.7,
                 fp16_param_groups=outs)
        per_param = len(calls)
        calls.clear()
        opt.step(grads=[gs[:4], gs[4:]], grad_scale=0.7, fp16_param_groups=outs_fused if out_dtype else None)
        for a, b in zip(ps, ref_ps):
            assert torch.equal(a, b)
        if out_dtype is not None:
            assert torch.equal(out_flat, torch.cat([o for row in outs for o in row]))
        if name == "adam_int8_state":  # per-block scales: a tensor per parameter, a call per parameter
            assert len(calls) == per_param
        else:  # a run per group; the skip splits group 2 in two, and then its step counters differ
            counts = "step" in opt.state[ps[0]]
            assert len(calls) == {2: 3, 3: 4 if counts else 2}.get(step, 2) < per_param
        if step == 1:  # a round trip through state_dict keeps the states end to end
            opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    for p, q in zip(ps, ref_ps):
        for k, v in ref.state[q].items():
            assert torch.equal(opt.state[p][k], v) if torch.is_tensor(v) else opt.state[p][k] == v


def test_laid_out_states_appear_at_the_first_step_or_load_end_to_end():
    """lay_out_states (what the engine's host path sets): no state before the first step (as
    torch and DeepSpeed: readers of the state see none), then each group's states in one buffer
    per key; a state_dict loaded into a fresh optimizer lands in such buffers too."""
    from zspeed.ops.adam import CPUAdam
    sizes = [5, 17, 1, 40]
    _, ps = _end_to_end(sizes)
    opt = CPUAdam([{"params": ps}], lr=1e-2)
    opt.lay_out_states = True
    assert len(opt.state) == 0
    _, gs = _end_to_end(sizes, seed=3)
    opt.step(grads=[gs])

    def one_buffer(o, params):
        ptrs = {o.state[p][k].untyped_storage().data_ptr() for p in params for k in ("exp_avg", "exp_avg_sq")}
        return len(ptrs) == 2 and all(o.state[p]["step"] == 1 for p in params)
    assert one_buffer(opt, ps)
    _, qs = _end_to_end(sizes, seed=7)
    fresh = CPUAdam([{"params": qs}], lr=1e-2)
    fresh.lay_out_states = True
    fresh.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert one_buffer(fresh, qs)
    for p, q in zip(ps, qs):
        assert torch.equal(opt.state[p]["exp_avg_sq"], fresh.state[q]["exp_avg_sq"])
