"""DeepSpeed's tensor-fragment API (zspeed.utils.safe_get_full_grad and its siblings) on every
optimizer path: whole parameters on the device (fp32 and with fp32 masters), the CPU and
NVMe offload, the GPU/CPU split, ZeRO-3 with its host shards (the gradients in the shards
too) and the store split, on one rank and on two Gloo ranks.

Two kinds of check:
- against a float64 reference: the gradients read after backward equal autograd's in float64
  (fp32 runs; tolerance rtol 1e-5 / atol 1e-7 on the CPU: the engine computes in fp32, which
  rounds at about 6e-8 relative, and the sums over a few hundred terms stay well inside it;
  rtol 1e-4 / atol 1e-6 on CUDA, whose GEMMs sum in other orders and blocks); the optimizer
  state after a step and the weights of the step after a write of the state follow AdamW
  computed in float64 from the gradients read (rtol/atol 1e-6: one fp32 rounding of terms of
  size 1e-2..1; on CUDA rtol 1e-4 / atol 1e-5 for the weights, as torch's fused AdamW there
  takes the bias correction 1 - 0.999^t in fp32, which cancellation leaves about 5e-5
  relative);
- bit for bit, engine against engine: gradients read from one engine and written into a
  second one (whose backward saw other data) make the second's step equal the first's
  exactly, clipping and norm included (a stale norm would change the clip factor). On CUDA the
  first engine's norm comes from norms taken on the device while the gradients were copied, the
  second's (whose gradients were written on the host) from the host kernel: they agree to
  1e-6 relative (a stale norm is off by far more), and clipping is off there so that the
  steps stay comparable bit for bit.
"""
from __future__ import annotations

import copy
import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_zero3 as z3  # noqa: E402
from distrun import run_ranks  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.engine import EngineClosedError  # noqa: E402
from zspeed.runtime.errors import FragmentError  # noqa: E402
from zspeed.utils import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,  # noqa: E402
                          safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
                          safe_set_full_fp32_param, safe_set_full_grad, safe_set_full_optimizer_state,
                          safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
                          safe_update_full_grad_vectorized)

LR, WD, B1, B2, EPS, CLIP = 1e-2, 0.01, 0.9, 0.999, 1e-8, 0.5
GRAD_TOL = dict(rtol=1e-5, atol=1e-7) if z3.DEVICE == "cpu" else dict(rtol=1e-4, atol=1e-6)  # (see above)
WEIGHT_TOL = dict(rtol=1e-6, atol=1e-6) if z3.DEVICE == "cpu" else dict(rtol=1e-4, atol=1e-5)

# name -> (stage, optimizer offload, param offload, precision, ratio): one per optimizer path
CASES = {
    "s0-fp32": (0, "none", "none", "fp32", None),          # DevicePath (the parameters are the masters)
    "s1-bf16": (1, "none", "none", "bf16", None),          # DeviceMasterPath
    "s2-cpu-fp32": (2, "cpu", "none", "fp32", None),       # HostPath
    "s2-cpu-fp16": (2, "cpu", "none", "fp16", None),       # HostPath, loss scale divided out
    "s2-nvme-fp32": (2, "nvme", "none", "fp32", None),     # NVMePath
    "s2-split-bf16": (2, "cpu", "none", "bf16", 0.5),      # StoreSplitPath on one rank
    "s3-fp32": (3, "none", "none", "fp32", None),          # ZeRO-3 pieces on the device
    "s3-cpu-bf16": (3, "cpu", "cpu", "bf16", None),        # ZeRO-3, gradients in the host shards
    "s3-nvme-fp32": (3, "nvme", "cpu", "fp32", None),      # ZeRO-3, NVMe states
    "s3-split-bf16": (3, "cpu", "cpu", "bf16", 0.5),       # StoreSplitPath
    "s2-overlap-fp32": (2, "cpu", "none", "fp32", None),   # HostPath, the step in the background
    "s3-overlap-bf16": (3, "cpu", "cpu", "bf16", None),    # ... at ZeRO-3, the gradients in the shards
}
OVERLAP = {"s2-overlap-fp32", "s3-overlap-bf16"}  # offload_optimizer.overlap_forward
FP32 = [k for k, c in CASES.items() if c[3] == "fp32"]


def _cfg(case, tmp, clip=CLIP):
    stage, opt, param, precision, ratio = CASES[case]
    c = z3._cfg(stage, opt=opt, param=param, precision=precision, tmp=tmp, lr=LR)
    c["gradient_clipping"] = clip
    if ratio is not None:
        c["zero_optimization"]["offload_optimizer"]["ratio"] = ratio
    if case in OVERLAP:
        c["zero_optimization"]["offload_optimizer"]["overlap_forward"] = True
    return c


def _engine(case, tmp, seed=0, clip=CLIP):
    tmp.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = z3.Model()
    ref = copy.deepcopy(model).double()
    e = zspeed.initialize(model=model, config=_cfg(case, tmp, clip))[0]
    return e, ref


def _named(e):
    return list(e.module.named_parameters())


def _ref_grads(ref, idx):
    """The reference's gradients of one batch, on the CPU (the reference runs where it lives)."""
    ref.zero_grad()
    idx = idx.to(next(ref.parameters()).device)
    logits = ref(idx)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # the loss in fp32 at least, as z3._loss
    torch.nn.functional.cross_entropy(logits.reshape(-1, z3.V), idx.reshape(-1)).backward()
    return {n: p.grad.detach().cpu().clone() for n, p in ref.named_parameters()}


def _adamw(w, g, m, v, step):
    """One AdamW step in float64 (torch's AdamW, which the engines run): new (w, m, v)."""
    m = B1 * m + (1 - B1) * g
    v = B2 * v + (1 - B2) * g * g
    mh, vh = m / (1 - B1 ** step), v / (1 - B2 ** step)
    w = w * (1 - LR * WD) - LR * mh / (vh.sqrt() + EPS)
    return w, m, v


def _clip_coef(grads: dict) -> float:
    norm = sum(float(g.double().pow(2).sum()) for g in grads.values()) ** 0.5
    return min(1.0, CLIP / (norm + 1e-6))


@pytest.mark.parametrize("case", FP32)
def test_reads_and_writes_follow_a_float64_reference(case, tmp_path):
    e, ref = _engine(case, tmp_path)
    idx = z3._data(2)
    w0 = {n: p.detach().double().clone() for n, p in ref.named_parameters()}
    e.backward(z3._loss(e, idx[0]))
    want = _ref_grads(ref, idx[0])
    grads = {}
    for n, p in _named(e):
        g = safe_get_full_grad(p)
        assert g.shape == want[n].shape and g.device == e.device
        torch.testing.assert_close(g.double().cpu(), want[n], **GRAD_TOL, msg=n)
        grads[n] = g.double().cpu()
        torch.testing.assert_close(safe_get_full_fp32_param(p).double().cpu(), w0[n], rtol=0, atol=0)
        assert safe_get_full_optimizer_state(p, "exp_avg") is None  # no state before the first step
    e.step()
    c = _clip_coef(grads)
    state = {}
    for n, p in _named(e):
        w, m, v = _adamw(w0[n], c * grads[n], 0.0, 0.0, 1)
        tol = dict(rtol=1e-6, atol=1e-6, msg=n)
        torch.testing.assert_close(safe_get_full_fp32_param(p).double().cpu(), w, **WEIGHT_TOL, msg=n)
        torch.testing.assert_close(safe_get_full_optimizer_state(p, "exp_avg").double().cpu(), m, **tol)
        torch.testing.assert_close(safe_get_full_optimizer_state(p, "exp_avg_sq").double().cpu(), v, **tol)
        # New weights and moments, written whole, then read back exactly.
        g = torch.Generator().manual_seed(len(n))
        nw = torch.rand(w.shape, generator=g) - 0.5
        nm = (torch.rand(w.shape, generator=g) - 0.5) * 1e-2
        nv = torch.rand(w.shape, generator=g) * 1e-4
        safe_set_full_fp32_param(p, nw)
        safe_set_full_optimizer_state(p, nm, "exp_avg")
        safe_set_full_optimizer_state(p, nv, "exp_avg_sq")
        assert torch.equal(safe_get_full_fp32_param(p).cpu(), nw)
        assert torch.equal(safe_get_full_optimizer_state(p, "exp_avg").cpu(), nm)
        assert torch.equal(safe_get_full_optimizer_state(p, "exp_avg_sq").cpu(), nv)
        state[n] = (nw.double(), nm.double(), nv.double())
    # The model's weights follow the written masters, and the next step starts from them.
    whole = z3._whole(e)
    for n, (nw, _m, _v) in state.items():
        assert torch.equal(whole[n].double(), nw), n
    e.backward(z3._loss(e, idx[1]))
    grads = {n: safe_get_full_grad(p).double().cpu() for n, p in _named(e)}
    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.copy_(state[n][0])
    want = _ref_grads(ref, idx[1])
    for n in grads:
        torch.testing.assert_close(grads[n], want[n], **GRAD_TOL, msg=n)
    e.step()
    c = _clip_coef(grads)
    for n, p in _named(e):
        nw, nm, nv = state[n]
        w, _m, _v = _adamw(nw, c * grads[n], nm, nv, 2)
        torch.testing.assert_close(safe_get_full_fp32_param(p).double().cpu(), w, **WEIGHT_TOL, msg=n)


@pytest.mark.parametrize("case", list(CASES))
def test_norm_groups_are_the_gradient_norms_the_step_sees(case, tmp_path):
    """optimizer._get_norm_groups() (DeepSpeed's): per parameter group, the norm of the gradients
    as safe_get_full_grad reads them, a write through the fragment API included; their combined
    norm is the global norm the step clips with. Refused by name outside backward..step."""
    e, _ = _engine(case, tmp_path)
    if CASES[case][0] == 0 and CASES[case][3] == "fp32":  # the basic optimizer itself, as DeepSpeed's
        assert isinstance(e.optimizer, torch.optim.AdamW) and not hasattr(e.optimizer, "_get_norm_groups")
        return
    with pytest.raises(FragmentError, match=r"_get_norm_groups\(\).*after the backward"):
        e.optimizer._get_norm_groups()
    e.backward(z3._loss(e, z3._data(1)[0]))
    def expected():
        per = [0.0] * len(e.optimizer.fp16_groups)
        for gi, group in enumerate(e.optimizer.fp16_groups):  # (the model's parameters per group)
            for p in group:
                per[gi] += float(safe_get_full_grad(p).double().square().sum())
        return [v ** 0.5 for v in per]
    got = [float(t) for t in e.optimizer._get_norm_groups()]
    assert got == pytest.approx(expected(), rel=1e-6)
    p = _named(e)[0][1]
    safe_set_full_grad(p, safe_get_full_grad(p) * 0.25)
    after = [float(t) for t in e.optimizer._get_norm_groups()]
    assert after == pytest.approx(expected(), rel=1e-6) and sum(after) < sum(got)
    e.step()
    assert sum(v * v for v in after) ** 0.5 == pytest.approx(e.get_global_grad_norm(), rel=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_moved_between_engines_give_the_same_step_bit_for_bit(case, tmp_path):
    """Engine B's gradients (read whole) written into engine A, whose backward saw other data:
    A's step equals B's exactly, its global norm (the clip factor) included."""
    clip = CLIP if z3.DEVICE == "cpu" else 0.0  # (see the module docstring)
    a, _ = _engine(case, tmp_path / "a", clip=clip)
    b, _ = _engine(case, tmp_path / "b", clip=clip)
    x, y = z3._data(2)
    a.backward(z3._loss(a, x))
    b.backward(z3._loss(b, y))
    gb = {n: safe_get_full_grad(p) for n, p in _named(b)}
    for n, p in _named(a):
        assert not torch.equal(safe_get_full_grad(p), gb[n]), n  # (the data differ)
    safe_update_full_grad_vectorized([p for _n, p in _named(a)], lambda g, p, names={id(q): n for n, q in _named(a)}:
                                     gb[names[id(p)]])
    for n, p in _named(a):
        assert torch.equal(safe_get_full_grad(p), gb[n]), n
    a.step()
    b.step()
    if z3.DEVICE == "cpu":
        assert a.get_global_grad_norm() == b.get_global_grad_norm()
    else:
        assert a.get_global_grad_norm() == pytest.approx(b.get_global_grad_norm(), rel=1e-6)
    for (n, p), (_, q) in zip(_named(a), _named(b)):
        assert torch.equal(safe_get_full_fp32_param(p), safe_get_full_fp32_param(q)), n
        assert torch.equal(safe_get_full_optimizer_state(p, "exp_avg_sq"), safe_get_full_optimizer_state(q, "exp_avg_sq"))
    assert z3._whole(a).keys() == z3._whole(b).keys()
    for k, v in z3._whole(a).items():
        assert torch.equal(v, z3._whole(b)[k]), k


def test_an_overflowing_gradient_written_skips_the_fp16_step(tmp_path):
    e, _ = _engine("s2-cpu-fp16", tmp_path)
    e.backward(z3._loss(e, z3._data(1)[0]))
    scale = e.loss_scaler.loss_scale
    n, p = _named(e)[0]
    before = safe_get_full_fp32_param(p).clone()
    g = safe_get_full_grad(p).clone()
    g.view(-1)[3] = float("inf")
    safe_set_full_grad(p, g)
    e.step()
    assert e.skipped_steps == 1 and e.loss_scaler.loss_scale <= scale  # (hysteresis may keep it once)
    assert torch.equal(safe_get_full_fp32_param(p), before)


@pytest.mark.parametrize("case", ["s3-fp32", "s3-cpu-bf16"])
def test_local_parts_of_a_zero3_parameter(case, tmp_path):
    """One rank: its local part of each parameter is all of it (flat)."""
    e, _ = _engine(case, tmp_path)
    e.backward(z3._loss(e, z3._data(1)[0]))
    for n, p in _named(e):
        assert torch.equal(safe_get_local_grad(p), safe_get_full_grad(p).reshape(-1)), n
        assert torch.equal(safe_get_local_fp32_param(p), safe_get_full_fp32_param(p).reshape(-1)), n
        v = torch.rand(p.ds_numel, dtype=safe_get_local_grad(p).dtype, device=e.device)
        safe_set_local_grad(p, v)
        assert torch.equal(safe_get_full_grad(p).reshape(-1), v), n
    e.step()
    for n, p in _named(e):
        st = safe_get_local_optimizer_state(p, "exp_avg")
        assert torch.equal(st, safe_get_full_optimizer_state(p, "exp_avg").reshape(-1)), n
        v = torch.rand(p.ds_numel, device=e.device)
        safe_set_local_optimizer_state(p, v, "exp_avg")
        safe_set_local_fp32_param(p, v)
        assert torch.equal(safe_get_local_optimizer_state(p, "exp_avg"), v)
        assert torch.equal(safe_get_local_fp32_param(p), v)


@pytest.mark.parametrize("case", ["s3-fp32", "s3-cpu-bf16", "s3-nvme-fp32", "s3-split-bf16"])
def test_ds_tensor_is_a_live_view_of_this_ranks_part(case, tmp_path):
    """DeepSpeed's p.ds_tensor under a ZeRO-3 engine: this rank's part of the parameter (the local
    API's elements, in the model's dtype), the shard itself: after a step it holds the new weights
    (the masters rounded), and an in-place write, or an assignment to its .data, is what the next
    gather reads."""
    e, _ = _engine(case, tmp_path)
    e.backward(z3._loss(e, z3._data(1)[0]))
    if case == "s3-cpu-bf16":  # gradients held in the host shards (docs/ZERO3.md): it holds them,
        # readable as soon as backward returns (on CUDA their copies to the host are complete)
        held = {n: p.ds_tensor.clone() for n, p in _named(e)}
        for n, p in _named(e):
            assert torch.equal(held[n], safe_get_local_grad(p).cpu()), n
    e.step()
    for n, p in _named(e):
        local = safe_get_local_fp32_param(p)
        assert p.ds_tensor.shape == local.shape and p.ds_tensor.dtype == e.dtype, n
        assert torch.equal(p.ds_tensor.cpu(), local.to(e.dtype).cpu()), n
    n, p = _named(e)[0]
    with torch.no_grad():
        p.ds_tensor.fill_(0.5)
    with zspeed.zero.GatheredParameters([p]):
        assert torch.all(p == 0.5)
    # DeepSpeed's scripts assign through .data (tests/unit/v1/zero/test_zero.py): reaches the store too
    p.ds_tensor.data = torch.full_like(p.ds_tensor.data, 0.25)
    with zspeed.zero.GatheredParameters([p]):
        assert torch.all(p == 0.25)
    assert isinstance(p.ds_tensor.data, torch.Tensor) and torch.all(p.ds_tensor == 0.25)
    with pytest.raises(ValueError, match=r"ds_tensor.data = a tensor of shape \(3,\).*safe_set_full_fp32_param"):
        p.ds_tensor.data = torch.zeros(3)
    with zspeed.zero.GatheredParameters([p]):
        assert torch.all(p == 0.25)  # nothing written by the refused assignment
    e.close()  # handed back (one rank): the parameter whole again, no ZeRO-3 attributes
    assert not hasattr(p, "ds_tensor") and torch.all(p == 0.25)


def test_what_is_not_served_is_refused_by_name(tmp_path):
    e, _ = _engine("s2-cpu-fp32", tmp_path)
    n, p = _named(e)[0]
    with pytest.raises(FragmentError, match="after the backward of an accumulation boundary"):
        safe_get_full_grad(p)  # no backward yet
    with pytest.raises(FragmentError, match="no state for this parameter yet"):
        safe_set_full_optimizer_state(p, torch.zeros(p.shape), "exp_avg")
    with pytest.raises(AssertionError, match="ZeRO-3 partitioned parameters only"):
        safe_get_local_fp32_param(p)
    with pytest.raises(FragmentError, match=r"has 3 elements .* the parameter"):
        safe_set_full_fp32_param(p, torch.zeros(3))
    e.backward(z3._loss(e, z3._data(1)[0]))
    safe_get_full_grad(p)
    with pytest.raises(FragmentError, match="call engine.step"):
        e.backward(z3._loss(e, z3._data(1)[0]))  # the gradients were collected for the step
    e.step()
    with pytest.raises(FragmentError, match="no per-element state 'momentum'"):
        safe_get_full_optimizer_state(p, "momentum")
    # Parameters no engine trains: None, and writes do nothing (as DeepSpeed's).
    stray = torch.nn.Parameter(torch.ones(4))
    frozen = torch.nn.Parameter(torch.ones(4), requires_grad=False)
    for q in (stray, frozen):
        assert safe_get_full_fp32_param(q) is None and safe_get_full_grad(q) is None
        assert safe_get_full_optimizer_state(q, "exp_avg") is None
        safe_set_full_fp32_param(q, torch.zeros(4))
        assert torch.equal(q.detach(), torch.ones(4))
    e.close()
    with pytest.raises(EngineClosedError):
        safe_get_full_fp32_param(p)


def test_gradients_mid_accumulation_are_refused_then_served_at_the_boundary(tmp_path):
    cfg = _cfg("s2-cpu-fp32", tmp_path)
    cfg["gradient_accumulation_steps"] = 2
    torch.manual_seed(0)
    e = zspeed.initialize(model=z3.Model(), config=cfg)[0]
    x, y = z3._data(2)
    e.backward(z3._loss(e, x))
    p = _named(e)[0][1]
    with pytest.raises(FragmentError, match="micro-batch 2 of 2"):
        safe_get_full_grad(p)
    e.step()
    e.backward(z3._loss(e, y))
    assert safe_get_full_grad(p) is not None
    e.step()
    assert e.global_steps == 1



# stage, optimizer offload, precision: the paths engine.no_sync() runs on (ZeRO stages 0-1)
NO_SYNC = {"s0-fp32": (0, "none", "fp32"), "s1-fp32": (1, "none", "fp32"), "s1-cpu-fp32": (1, "cpu", "fp32"),
           "s1-nvme-fp32": (1, "nvme", "fp32"), "s0-bf16": (0, "none", "bf16"), "s1-cpu-fp16": (1, "cpu", "fp16")}


def _no_sync_engine(case, tmp):
    stage, opt, precision = NO_SYNC[case]
    torch.manual_seed(0)
    model = z3.Model()
    # bf16's 8-bit mantissa makes a float64 model's gradients too far from a bf16 forward's to
    # check the accumulation: its reference is the same model in bf16, run by plain torch on the
    # engine's device (the same kernels: a CPU's bf16 matmuls round otherwise than a GPU's)
    ref = (copy.deepcopy(model).to(torch.bfloat16).to(z3.DEVICE) if precision == "bf16" else
           copy.deepcopy(model).to(torch.float64))
    return zspeed.initialize(model=model, config=z3._cfg(stage, opt=opt, precision=precision, tmp=tmp))[0], ref


@pytest.mark.parametrize("case", list(NO_SYNC))
def test_inside_no_sync_gradients_are_this_ranks_accumulation(case, tmp_path):
    """Inside no_sync the gradient read is the sum of the backwards so far (one rank: float64
    reference for fp32; the loss scale divided out under fp16); a write replaces it, and the
    boundary backward after the block adds its own gradient to what was written."""
    e, ref = _no_sync_engine(case, tmp_path)
    data = z3._data(3)
    precision = NO_SYNC[case][2]
    fp32 = precision == "fp32"
    with e.no_sync():
        e.backward(z3._loss(e, data[0]))
        first = {n: safe_get_full_grad(p) for n, p in _named(e)}
        e.backward(z3._loss(e, data[1]))
        got = {n: safe_get_full_grad(p) for n, p in _named(e)}
        with pytest.raises(FragmentError, match="ZeRO-3"):
            safe_get_local_grad(_named(e)[0][1])
    for n, p in _named(e):  # on the parameter's device, as DeepSpeed's (the references are on the CPU)
        assert got[n].device == p.device, n
    first = {n: g.cpu() for n, g in first.items()}
    got = {n: g.cpu() for n, g in got.items()}
    r0, r1 = _ref_grads(ref, data[0]), _ref_grads(ref, data[1])
    for n, g in got.items():
        assert g.shape == dict(_named(e))[n].shape and g.dtype != torch.float16, n
        if fp32:
            torch.testing.assert_close(first[n].double(), r0[n], **GRAD_TOL, msg=n)
            torch.testing.assert_close(g.double(), r0[n] + r1[n], **GRAD_TOL, msg=n)
        elif precision == "bf16":  # the same bf16 gradients, summed in bf16: one rounding (2^-8) apart
            torch.testing.assert_close(g.double(), r0[n].double() + r1[n].double(), rtol=2 ** -7, atol=1e-5, msg=n)
        else:  # fp16 with a loss scale against float64: the sum within fp16 forward rounding
            torch.testing.assert_close(g.double(), r0[n] + r1[n], rtol=0.05, atol=0.02, msg=n)
    # a write inside the block: the boundary backward adds to it, and the step reads the sum
    with e.no_sync():
        written = {n: torch.full_like(g, 0.25, dtype=torch.float32) for n, g in got.items()}
        for n, p in _named(e):
            safe_set_full_grad(p, written[n])
        back = {n: safe_get_full_grad(p).cpu() for n, p in _named(e)}
    for n, g in back.items():
        torch.testing.assert_close(g.float(), written[n], rtol=0, atol=0, msg=n)
    e.backward(z3._loss(e, data[2]))
    r2 = _ref_grads(ref, data[2])
    after = {n: safe_get_full_grad(p).cpu() for n, p in _named(e)}
    if fp32:
        for n, g in after.items():
            torch.testing.assert_close(g.double(), r2[n] + 0.25, **GRAD_TOL, msg=n)
    e.step()
    assert e.global_steps == 1


NO_SYNC_WORKER = r"""
import os, sys
sys.path.insert(0, HERE)
from pathlib import Path
import torch, zspeed
import test_zero3 as T
import test_tensor_fragments as F
from zspeed.utils import safe_get_full_grad
zspeed.init_distributed()
rank = zspeed.comm.get_rank()
data = T._data(4)
out = {}
for case in ("s0-fp32", "s1-cpu-fp32"):
    e, _ = F._no_sync_engine(case, Path(os.environ["ZS_TMP"]) / case)
    with e.no_sync():
        e.backward(T._loss(e, data[rank]))
        local = {n: safe_get_full_grad(p) for n, p in F._named(e)}
    e.backward(T._loss(e, data[2 + rank]))   # the boundary: reduces the block's sum with its own
    out[case] = (local, {n: safe_get_full_grad(p) for n, p in F._named(e)})
    e.step()
    e.close()
torch.save(out, os.path.join(os.environ["ZS_TMP"], f"ns.{rank}.pt"))
""".replace("HERE", repr(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(z3.DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
def test_two_ranks_inside_no_sync_read_their_own_gradients(tmp_path):
    """Two Gloo ranks: inside no_sync each rank reads the gradient of its own data (not the
    mean); at the boundary after the block, both read the mean of the four backwards."""
    res = run_ranks(2, NO_SYNC_WORKER, env={"ZS_TMP": str(tmp_path)}, timeout=300)
    for r in res:
        assert r.returncode == 0, r
    torch.manual_seed(0)
    ref = z3.Model().double()
    data = z3._data(4)
    g = [_ref_grads(ref, d) for d in data]
    for rank in range(2):
        out = torch.load(tmp_path / f"ns.{rank}.pt")
        for case, (local, boundary) in out.items():
            for n, t in local.items():
                torch.testing.assert_close(t.double(), g[rank][n], **GRAD_TOL, msg=f"{case} {rank} {n}")
                mean = (g[0][n] + g[1][n] + g[2][n] + g[3][n]) / 2
                torch.testing.assert_close(boundary[n].double(), mean, **GRAD_TOL, msg=f"{case} {rank} {n}")


WORKER = r'''
import json, os, sys
sys.path.insert(0, HERE)
from pathlib import Path
import torch, zspeed
import test_zero3 as T
import test_tensor_fragments as F
from zspeed.utils import *
a = json.loads(os.environ["ZS_FRAG_ARGS"])
zspeed.init_distributed()
rank = zspeed.comm.get_rank()
data = T._data(4)
for case in a["cases"]:
    ea, _ = F._engine(case, Path(a["tmp"]) / f"{case}-a")  # (the ranks agree on the config)
    eb, _ = F._engine(case, Path(a["tmp"]) / f"{case}-b")
    ea.backward(T._loss(ea, data[2 + rank]))
    eb.backward(T._loss(eb, data[rank]))
    names = [n for n, _ in F._named(eb)]
    gb = {n: safe_get_full_grad(p) for n, p in F._named(eb)}
    local = {n: safe_get_local_grad(p).numel() for n, p in F._named(eb)} if case.startswith("s3") else {}
    for n, p in F._named(ea):
        safe_set_full_grad(p, gb[n])
    groups = ([float(t) for t in ea.optimizer._get_norm_groups()]  # (a collective: every rank)
              if hasattr(ea.optimizer, "_get_norm_groups") else None)  # (stage 0 fp32: the basic optimizer)
    ea.step()
    eb.step()
    out = {"grads": gb, "local": local, "norm": (ea.get_global_grad_norm(), eb.get_global_grad_norm()),
           "groups": groups}
    for tag, e in (("a", ea), ("b", eb)):
        out[tag] = {n: (safe_get_full_fp32_param(p), safe_get_full_optimizer_state(p, "exp_avg_sq"))
                    for n, p in F._named(e)}
    torch.save(out, os.path.join(a["tmp"], f"{case}.{rank}.pt"))
    ea.close()
    eb.close()
'''.replace("HERE", repr(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(z3.DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
def test_two_ranks_assemble_full_values_and_move_gradients_bit_for_bit(tmp_path):
    """Two Gloo ranks, every path: each rank reads the same whole gradient (the mean over the
    ranks' data: float64 reference for fp32), ZeRO-3's local parts add up to the parameter, and
    gradients moved between engines give the same step on both ranks."""
    import json
    cases = list(CASES)
    res = run_ranks(2, WORKER, env={"ZS_FRAG_ARGS": json.dumps({"cases": cases, "tmp": str(tmp_path)})},
                    timeout=600)
    for r in res:
        assert r.returncode == 0, r
    torch.manual_seed(0)
    ref = z3.Model().double()
    data = z3._data(4)
    want = {n: (g0 + g1) / 2 for (n, g0), g1 in zip(_ref_grads(ref, data[0]).items(),
                                                     _ref_grads(ref, data[1]).values())}
    for case in cases:
        r0, r1 = (torch.load(tmp_path / f"{case}.{r}.pt") for r in range(2))
        for n, g in r0["grads"].items():
            assert torch.equal(g, r1["grads"][n]), (case, n)  # every rank gets the whole of it
            if CASES[case][3] == "fp32":
                torch.testing.assert_close(g.double(), want[n], **GRAD_TOL, msg=f"{case} {n}")
            if r0["local"]:
                assert r0["local"][n] + r1["local"][n] == g.numel(), (case, n)
        for out in (r0, r1):
            assert out["norm"][0] == out["norm"][1], case
            # DeepSpeed's per-group norms: of the gradients written, summed over the ranks' parts
            assert out["groups"] == r0["groups"], case
            if out["groups"] is not None:
                assert sum(g * g for g in out["groups"]) ** 0.5 == pytest.approx(out["norm"][0], rel=1e-6), case
            for n, (w, v) in out["a"].items():
                assert torch.equal(w, out["b"][n][0]) and torch.equal(v, out["b"][n][1]), (case, n)
                assert torch.equal(w, r1["a"][n][0]), (case, n)


SMALL_PARAM = r"""
import torch, zspeed
from zspeed.utils import safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state
r = torch.distributed.get_rank() if torch.distributed.is_initialized() else None
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 1), torch.nn.Linear(1, 1), torch.nn.Linear(1, 16))
cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
       "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
e, *_ = zspeed.initialize(model=m, config=cfg)
r = e.global_rank
def shapes(state):
    out = []
    for n, p in e.module.named_parameters():
        t = safe_get_local_optimizer_state(p, "exp_avg") if state else safe_get_local_grad(p)
        f = safe_get_local_fp32_param(p)
        assert p.ds_tensor.numel() == f.numel() and p.ds_tensor.dtype == p.dtype, n  # the live view of it
        out.append((n, None if t is None else t.numel(), f.numel()))
    return out
loss = e(torch.randn(2, 16)).square().mean()
e.backward(loss)
print("BEFORE", r, shapes(True))   # no state before the first step: None on every rank
print("GRAD", r, shapes(False))
e.step()
print("AFTER", r, shapes(True))
"""


def test_local_parts_on_a_rank_holding_none_of_a_parameter_are_empty_not_none():
    """ZeRO-3 on two ranks: a one-element parameter lies wholly on rank 0; rank 1's local part of
    its master, gradient and (after the first step) optimizer state is an empty tensor, as
    DeepSpeed's, not None (None means no state yet, or a parameter nothing trains)."""
    res = run_ranks(2, SMALL_PARAM, timeout=240)
    for r in res:
        assert r.returncode == 0, r
    import ast
    got = {}
    for r in res:
        for line in r.stdout.splitlines():
            tag, rank, rest = line.split(" ", 2) if line.startswith(("BEFORE", "GRAD", "AFTER")) else (None,) * 3
            if tag:
                got[(tag, int(rank))] = dict((n, (a, b)) for n, a, b in ast.literal_eval(rest))
    for rank in (0, 1):
        assert all(a is None for a, _ in got[("BEFORE", rank)].values())
    one = "1.weight"  # one element: rank 0 holds it, rank 1 only padding
    assert got[("AFTER", 0)][one] == (1, 1) and got[("AFTER", 1)][one] == (0, 0)
    assert got[("GRAD", 0)][one] == (1, 1) and got[("GRAD", 1)][one] == (0, 0)
    for rank in (0, 1):
        assert all(a is not None for a, _ in got[("AFTER", rank)].values())
    # the pieces of each parameter add up to its size over the ranks
    for n, p in torch.nn.Sequential(torch.nn.Linear(16, 1), torch.nn.Linear(1, 1),
                                     torch.nn.Linear(1, 16)).named_parameters():
        assert got[("AFTER", 0)][n][1] + got[("AFTER", 1)][n][1] == p.numel(), n
