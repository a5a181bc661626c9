"""The functional layer under both the numpy API and the torch optimizers:
validates shapes, fills the C structs and calls one kernel per tensor.
C messages already name the function, so check() adds no prefix."""
from __future__ import annotations

import ctypes

from .._native import check, lib
from .._signatures.optim import (BF16, F16, F32, NONE, OPTIM_QBLOCK, Q8,
                                 AdagradConfig, AdamConfig, LionConfig,
                                 OptimTensors)
from ._tensors import INT64, buf, integer, threads


def qblocks(n: int) -> int:
    """Number of 8-bit quantization blocks (scales per state) for n elements."""
    return (n + OPTIM_QBLOCK - 1) // OPTIM_QBLOCK


def _tensors(param, grad, m, v, out, m_scale=None, v_scale=None) -> OptimTensors:
    t = OptimTensors()
    lib.zs_optim_tensors_init(ctypes.byref(t))
    p = buf(param, "param", writable=True)
    g = buf(grad, "grad")
    if g.n != p.n:
        raise ValueError(f"grad has {g.n} elements but param has {p.n}; they "
                         f"must match")
    t.n, t.param, t.param_dtype = p.n, p.ptr, p.dtype
    t.grad, t.grad_dtype = g.ptr, g.dtype
    sd = None
    for name, s, attr in (("state m", m, "m"), ("state v", v, "v")):
        if s is None:
            continue
        b = buf(s, name, writable=True, allowed=(F32, BF16, Q8))
        if b.n != p.n:
            raise ValueError(f"{name} has {b.n} elements but param has {p.n}")
        if sd is not None and b.dtype != sd:
            raise TypeError("the two optimizer states must have the same dtype")
        if b.dtype == Q8 and b.kind != ("int8" if attr == "m" else "uint8"):
            raise TypeError(f"8-bit {name} must be "
                            f"{'int8' if attr == 'm' else 'uint8'}, not {b.kind}")
        sd = b.dtype
        setattr(t, attr, b.ptr)
    t.state_dtype = F32 if sd is None else sd
    if sd == Q8:
        nb = qblocks(p.n)
        for name, s, attr in (("exp_avg scale", m_scale, "m_scale"),
                              ("exp_avg_sq scale", v_scale, "v_scale")):
            if s is None:
                raise ValueError(f"8-bit states need the {name} array "
                                 f"({nb} fp32 values)")
            b = buf(s, name, writable=True, allowed=(F32,))
            if b.n != nb:
                raise ValueError(f"{name} has {b.n} elements; {p.n} params "
                                 f"need {nb}")
            setattr(t, attr, b.ptr)
    if out is not None:
        o = buf(out, "out", writable=True, allowed=(BF16, F16))
        if o.n != p.n:
            raise ValueError(f"out has {o.n} elements but param has {p.n}")
        t.out, t.out_dtype = o.ptr, o.dtype
    else:
        t.out_dtype = NONE
    return t


def adam(param, grad, exp_avg, exp_avg_sq, *, step, lr, beta1, beta2, eps,
         weight_decay, adamw_mode, bias_correction, grad_scale, out,
         exp_avg_scale, exp_avg_sq_scale, num_threads) -> None:
    t = _tensors(param, grad, exp_avg, exp_avg_sq, out, exp_avg_scale,
                 exp_avg_sq_scale)
    c = AdamConfig()
    lib.zs_adam_config_init(ctypes.byref(c))
    c.lr, c.beta1, c.beta2, c.eps = lr, beta1, beta2, eps
    c.weight_decay, c.grad_scale = weight_decay, grad_scale
    c.step = integer(step, "step", INT64)
    c.adamw_mode, c.bias_correction = int(bool(adamw_mode)), int(bool(bias_correction))
    c.num_threads = threads(num_threads)
    check(lib.zs_adam_step(ctypes.byref(c), ctypes.byref(t)))


def adagrad(param, grad, state_sum, *, lr, lr_decay, weight_decay, eps,
            grad_scale, out, num_threads) -> None:
    t = _tensors(param, grad, None, state_sum, out)
    c = AdagradConfig()
    lib.zs_adagrad_config_init(ctypes.byref(c))
    c.lr, c.lr_decay, c.weight_decay, c.eps = lr, lr_decay, weight_decay, eps
    c.grad_scale, c.num_threads = grad_scale, threads(num_threads)
    check(lib.zs_adagrad_step(ctypes.byref(c), ctypes.byref(t)))


def lion(param, grad, exp_avg, *, lr, beta1, beta2, weight_decay, grad_scale,
         out, num_threads) -> None:
    t = _tensors(param, grad, exp_avg, None, out)
    c = LionConfig()
    lib.zs_lion_config_init(ctypes.byref(c))
    c.lr, c.beta1, c.beta2, c.weight_decay = lr, beta1, beta2, weight_decay
    c.grad_scale, c.num_threads = grad_scale, threads(num_threads)
    check(lib.zs_lion_step(ctypes.byref(c), ctypes.byref(t)))


def grad_stats(tensors, scale=1.0, num_threads=None):
    """See zspeed.ops.grad_stats."""
    total, nonfinite = 0.0, False
    nt = threads(num_threads)
    for i, x in enumerate(tensors):
        b = buf(x, f"tensors[{i}]")
        s, nf = ctypes.c_double(), ctypes.c_int()
        check(lib.zs_grad_stats(b.ptr, b.dtype, b.n, float(scale), None, nt,
                                ctypes.byref(s), ctypes.byref(nf)))
        total += s.value
        nonfinite = nonfinite or bool(nf.value)
    return total, nonfinite


def _q8_args(codes_m, scale_m, codes_v, scale_v, n):
    """Addresses of 8-bit states for n elements, checked."""
    bm = buf(codes_m, "exp_avg", allowed=(Q8,))
    bv = buf(codes_v, "exp_avg_sq", allowed=(Q8,))
    sm = buf(scale_m, "exp_avg scale", allowed=(F32,))
    sv = buf(scale_v, "exp_avg_sq scale", allowed=(F32,))
    if bm.kind != "int8" or bv.kind != "uint8":
        raise TypeError("8-bit states are int8 exp_avg and uint8 exp_avg_sq")
    if bm.n != n or bv.n != n or sm.n != qblocks(n) or sv.n != qblocks(n):
        raise ValueError(f"8-bit states for {n} elements need {n} codes each "
                         f"and {qblocks(n)} scales each")
    return bm.ptr, sm.ptr, bv.ptr, sv.ptr


def q8_dequantize(codes_m, scale_m, codes_v, scale_v, m_out, v_out) -> None:
    """fp32 m_out, v_out from 8-bit Adam states (see optim.h for the map)."""
    mo = buf(m_out, "m_out", writable=True, allowed=(F32,))
    vo = buf(v_out, "v_out", writable=True, allowed=(F32,))
    if vo.n != mo.n:
        raise ValueError("m_out and v_out must have the same length")
    a = _q8_args(codes_m, scale_m, codes_v, scale_v, mo.n)
    check(lib.zs_adam_q8_dequantize(a[0], a[1], a[2], a[3], mo.n, mo.ptr, vo.ptr))


def q8_quantize(m, v, codes_m, scale_m, codes_v, scale_v) -> None:
    """8-bit Adam states from fp32 m and v (v >= 0), e.g. to convert a
    checkpoint's fp32 states."""
    bm = buf(m, "m", allowed=(F32,))
    bv = buf(v, "v", allowed=(F32,))
    if bv.n != bm.n:
        raise ValueError("m and v must have the same length")
    for x, nm in ((codes_m, "exp_avg"), (codes_v, "exp_avg_sq"),
                  (scale_m, "exp_avg scale"), (scale_v, "exp_avg_sq scale")):
        buf(x, nm, writable=True, allowed=(Q8, F32))
    a = _q8_args(codes_m, scale_m, codes_v, scale_v, bm.n)
    check(lib.zs_adam_q8_quantize(bm.ptr, bv.ptr, bm.n, a[0], a[1], a[2], a[3]))
