"""zspeed.ops.swap.NVMeOptimizerSwapper: bit-exact equality with the in-RAM
C kernels (called directly through ctypes on numpy buffers), a float64
reference, checkpoints (fp32 and raw), torch tensors, injected faults, and
cleanup. Each test runs once per aio backend this machine has."""
import ctypes
import os

import numpy as np
import pytest

from zspeed import NativeError
from zspeed._native import errcode, lib, load
from zspeed.ops.aio import aio_backend
from zspeed.ops.swap import NVMeOptimizerSwapper

BACKENDS = ["io_uring", "threads"]
SIZES = [70001, 1, 4099, 3]


@pytest.fixture(params=BACKENDS)
def backend(request):
    try:
        aio_backend(request.param)
    except NativeError as e:
        pytest.skip(f"{request.param}: {e.detail}")
    return request.param


class _AdamCfg(ctypes.Structure):
    _fields_ = [(n, ctypes.c_double) for n in
                ("lr", "beta1", "beta2", "eps", "weight_decay", "grad_scale")] + \
               [("step", ctypes.c_int64), ("adamw_mode", ctypes.c_int),
                ("bias_correction", ctypes.c_int), ("amsgrad", ctypes.c_int),
                ("num_threads", ctypes.c_int), ("pool", ctypes.c_void_p)]


class _Tensors(ctypes.Structure):
    _fields_ = [("n", ctypes.c_size_t), ("param", ctypes.c_void_p),
                ("param_dtype", ctypes.c_int), ("grad", ctypes.c_void_p),
                ("grad_dtype", ctypes.c_int), ("m", ctypes.c_void_p),
                ("v", ctypes.c_void_p), ("state_dtype", ctypes.c_int),
                ("m_scale", ctypes.c_void_p), ("v_scale", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("out_dtype", ctypes.c_int)]


# A private prototype (not an attribute of the shared lib object), so this
# test does not depend on, or interfere with, the optim area's signatures.
_adam_step = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_AdamCfg),
                              ctypes.POINTER(_Tensors))(("zs_adam_step", load()))


def _ram_adam(p, m, v, g, g_dt, out, lr, wd, step, scale):
    """zs_adam_step on in-RAM fp32 buffers (AdamW, default betas/eps)."""
    cfg = _AdamCfg(lr, 0.9, 0.999, 1e-8, wd, scale, step, 1, 1, 0, 0, None)
    t = _Tensors(p.size, p.ctypes.data, 0, g.ctypes.data, g_dt, m.ctypes.data,
                 v.ctypes.data, 0, None, None, out.ctypes.data, 1)
    assert _adam_step(ctypes.byref(cfg), ctypes.byref(t)) == 0


def _bf16_bits(rng, n):
    """Random finite bf16 values as uint16 bits."""
    r = rng.integers(0, 1 << 16, n, dtype=np.uint32)
    return ((r & 0x807F) | ((100 + r % 30) << 7)).astype(np.uint16)


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_bit_exact_with_in_ram_kernel(tmp_path, backend):
    rng = np.random.default_rng(1)
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    with NVMeOptimizerSwapper(SIZES, tmp_path, weight_decay=0.01, backend=backend,
                              buffer_count=3) as sw:
        for i, p in enumerate(params):
            sw.init_partition(i, p)
        ref = [(p.copy(), np.zeros_like(p), np.zeros_like(p)) for p in params]
        for t in range(1, 6):
            grads = [_bf16_bits(rng, n) for n in SIZES]
            outs = [np.zeros(n, np.uint16) for n in SIZES]
            routs = [np.zeros(n, np.uint16) for n in SIZES]
            lr = 1e-3 * (1 + 0.1 * t)
            sw.step(grads, grad_scale=0.5, out=outs, lr=lr, grad_dtype="bf16",
                    out_dtype="bf16")
            for (p, m, v), g, ro in zip(ref, grads, routs):
                _ram_adam(p, m, v, g, 1, ro, lr, 0.01, t, 0.5)
            for i, (p, m, v) in enumerate(ref):
                st = sw.get_state(i)
                assert st["param"].tobytes() == p.tobytes(), f"step {t} partition {i}"
                assert st["exp_avg"].tobytes() == m.tobytes()
                assert st["exp_avg_sq"].tobytes() == v.tobytes()
                assert outs[i].tobytes() == routs[i].tobytes()
        assert sw.steps == 5
        s = sw.stats()
        assert s["steps"] == 5 and s["bytes_written"] >= 5 * sw.file_bytes // 2


def test_float64_reference(tmp_path, backend):
    """AdamW with fp32 state against float64 math. Tolerance: each step
    rounds p, m, v to fp32 (relative 6e-8 each); after 4 steps of size lr the
    parameter error stays far below 1e-6 absolute, the moments below 1e-5
    relative."""
    rng = np.random.default_rng(2)
    sizes = [1001, 37]
    p64 = [rng.standard_normal(n) for n in sizes]
    with NVMeOptimizerSwapper(sizes, tmp_path, lr=1e-2, betas=(0.8, 0.99), eps=1e-6,
                              weight_decay=0.1, backend=backend) as sw:
        for i, p in enumerate(p64):
            sw.init_partition(i, p.astype(np.float32))
        p64 = [p.astype(np.float32).astype(np.float64) for p in p64]
        m64 = [np.zeros(n) for n in sizes]
        v64 = [np.zeros(n) for n in sizes]
        for t in range(1, 5):
            grads = [rng.standard_normal(n).astype(np.float32) for n in sizes]
            sw.step(grads, grad_scale=2.0)
            for i, g in enumerate(grads):
                g = g.astype(np.float64) * 2.0
                m64[i] = 0.8 * m64[i] + 0.2 * g
                v64[i] = 0.99 * v64[i] + 0.01 * g * g
                p64[i] *= 1 - 1e-2 * 0.1
                bc1, bc2 = 1 - 0.8 ** t, 1 - 0.99 ** t
                p64[i] -= 1e-2 / bc1 * m64[i] / (np.sqrt(v64[i]) / np.sqrt(bc2) + 1e-6)
        for i in range(len(sizes)):
            st = sw.get_state(i)
            np.testing.assert_allclose(st["param"], p64[i], rtol=0, atol=1e-6)
            np.testing.assert_allclose(st["exp_avg"], m64[i], rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(st["exp_avg_sq"], v64[i], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("state_dtype,raw", [("fp32", False), ("bf16", False),
                                             ("int8", True)])
def test_checkpoint_roundtrip(tmp_path, backend, state_dtype, raw):
    rng = np.random.default_rng(3)
    kw = dict(state_dtype=state_dtype, backend=backend, lr=3e-3)
    with NVMeOptimizerSwapper(SIZES, tmp_path, **kw) as a:
        for i, n in enumerate(SIZES):
            a.init_partition(i, rng.standard_normal(n))
        for _ in range(3):
            a.step([rng.standard_normal(n).astype(np.float32) for n in SIZES])
        a.set_hparams(lr=5e-4)
        sd = a.state_dict(raw=raw)
        with NVMeOptimizerSwapper(SIZES, tmp_path, **kw) as b:
            b.load_state_dict(sd)
            assert b.steps == 3 and b.lr == 5e-4
            grads = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
            a.step(grads)
            b.step(grads)
            for i in range(len(SIZES)):
                assert a.read_image(i).tobytes() == b.read_image(i).tobytes()


def test_torch_tensors_match_numpy(tmp_path, backend):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    grads = [_bf16_bits(rng, n) for n in SIZES]
    with NVMeOptimizerSwapper(SIZES, tmp_path, optimizer="lion", state_dtype="bf16",
                              backend=backend) as a, \
            NVMeOptimizerSwapper(SIZES, tmp_path, optimizer="lion", state_dtype="bf16",
                                 backend=backend) as b:
        for i, p in enumerate(params):
            a.init_partition(i, p)
            b.init_partition(i, torch.from_numpy(p))
        outs_np = [np.zeros(n, np.uint16) for n in SIZES]
        outs_t = [torch.zeros(n, dtype=torch.bfloat16) for n in SIZES]
        a.step(grads, out=outs_np, grad_dtype="bf16", out_dtype="bf16")
        b.step([torch.from_numpy(_bf16_to_f32(g)).to(torch.bfloat16) for g in grads],
               out=outs_t)
        for i in range(len(SIZES)):
            assert a.read_image(i).tobytes() == b.read_image(i).tobytes()
            assert outs_np[i].tobytes() == outs_t[i].view(torch.int16).numpy().tobytes()
            assert set(a.get_state(i)) == {"param", "exp_avg"}


@pytest.mark.parametrize("site,n,err", [("swap.write", 2, "ZS_ENOSPC"),
                                        ("swap.read", 3, "ZS_EIO"),
                                        ("aio.io", 5, "ZS_EIO")])
def test_fault_keeps_previous_step(tmp_path, backend, site, n, err):
    rng = np.random.default_rng(5)
    with NVMeOptimizerSwapper(SIZES, tmp_path, backend=backend) as sw:
        for i, s in enumerate(SIZES):
            sw.init_partition(i, rng.standard_normal(s))
        grads = [rng.standard_normal(s).astype(np.float32) for s in SIZES]
        sw.step(grads)
        before = [sw.read_image(i) for i in range(len(SIZES))]
        lib.zs_fault_set(site.encode(), n, 1, errcode(err))
        try:
            with pytest.raises(NativeError) as ei:
                sw.step(grads)
        finally:
            lib.zs_fault_clear()
        assert ei.value.name == err
        assert "keeps the state of step 1" in ei.value.detail
        assert sw.steps == 1 and sw.stats()["failed_steps"] == 1
        for i in range(len(SIZES)):
            assert sw.read_image(i).tobytes() == before[i].tobytes()
        sw.step(grads)
        assert sw.steps == 2


def test_errors_and_cleanup(tmp_path):
    with pytest.raises(ValueError, match="optimizer"):
        NVMeOptimizerSwapper([4], tmp_path, optimizer="sgd")
    with pytest.raises(NativeError) as ei:
        NVMeOptimizerSwapper([4], tmp_path, optimizer="lion", state_dtype="int8")
    assert ei.value.name == "ZS_EDTYPE"
    with pytest.raises(NativeError) as ei:
        NVMeOptimizerSwapper([4], tmp_path / "missing")
    sw = NVMeOptimizerSwapper([5, 6], tmp_path, name="x")
    with pytest.raises(NativeError) as ei:
        NVMeOptimizerSwapper([5], tmp_path, name="x")
    assert ei.value.name == "ZS_EEXIST"
    with pytest.raises(ValueError, match="elements"):
        sw.init_partition(0, np.zeros(4, np.float32))
    sw.init_partition(0, np.zeros(5))
    with pytest.raises(NativeError) as ei:
        sw.step([np.zeros(5, np.float32), np.zeros(6, np.float32)])
    assert ei.value.name == "ZS_ESTATE" and "partition 1" in ei.value.detail
    with pytest.raises(ValueError, match="unknown state"):
        sw.set_state(0, np.zeros(5), sum=np.zeros(5))
    path = sw.file_path
    assert os.path.exists(path)
    sw.close()
    sw.close()
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
def test_matches_zspeed_ops_adam_step(tmp_path, backend, state_dtype):
    """The engine's CPU-offload path (zspeed.ops.adam.adam_step on RAM
    buffers) and the NVMe path give the same bits, step after step."""
    adam = pytest.importorskip("zspeed.ops.adam", reason="zspeed.ops.adam (optim area) "
                               "not in this tree")
    rng = np.random.default_rng(6)
    sizes = [20001, 7]
    sdt = np.float32 if state_dtype == "fp32" else np.uint16
    with NVMeOptimizerSwapper(sizes, tmp_path, state_dtype=state_dtype, lr=2e-3,
                              weight_decay=0.05, backend=backend) as sw:
        ref = []
        for i, n in enumerate(sizes):
            p = rng.standard_normal(n).astype(np.float32)
            sw.init_partition(i, p)
            ref.append((p, np.zeros(n, sdt), np.zeros(n, sdt), np.zeros(n, np.uint16)))
        for t in range(1, 5):
            grads = [_bf16_bits(rng, n) for n in sizes]
            outs = [np.zeros(n, np.uint16) for n in sizes]
            sw.step(grads, grad_scale=0.25, out=outs, grad_dtype="bf16", out_dtype="bf16")
            for i, ((p, m, v, o), g) in enumerate(zip(ref, grads)):
                adam.adam_step(p, g, m, v, step=t, lr=2e-3, weight_decay=0.05,
                               grad_scale=0.25, out=o)
                st = sw.get_state(i)
                conv = (lambda a: a) if state_dtype == "fp32" else _bf16_to_f32
                assert st["param"].tobytes() == p.tobytes()
                assert st["exp_avg"].tobytes() == conv(m).tobytes()
                assert st["exp_avg_sq"].tobytes() == conv(v).tobytes()
                assert outs[i].tobytes() == o.tobytes()


def test_fp32_out_is_the_updated_master(tmp_path):
    """out buffers in float32 receive an exact copy of the updated masters."""
    sizes = [1000, 333]
    rng = np.random.default_rng(7)
    with NVMeOptimizerSwapper(sizes, tmp_path, lr=1e-2) as sw:
        for i, n in enumerate(sizes):
            sw.init_partition(i, rng.standard_normal(n).astype(np.float32))
        grads = [rng.standard_normal(n).astype(np.float32) for n in sizes]
        outs = [np.full(n, np.nan, np.float32) for n in sizes]
        sw.step(grads, out=outs)
        for i in range(len(sizes)):
            assert np.array_equal(outs[i], sw.get_state(i)["param"])  # a copy: exact


def test_uint16_is_bf16_without_naming_it(tmp_path):
    """numpy uint16 buffers hold bf16 bits for the swapper as for the
    optimizers: naming the dtype (grad_dtype="bf16") changes nothing, and a
    name that contradicts the buffer is refused."""
    rng = np.random.default_rng(11)
    sizes = [300, 7]
    init = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    grads = [_bf16_bits(rng, n) for n in sizes]
    images = []
    for kw in ({}, {"grad_dtype": "bf16"}):
        with NVMeOptimizerSwapper(sizes, tmp_path, lr=1e-2) as sw:
            for i, p in enumerate(init):
                sw.init_partition(i, p)
            sw.step(grads, **kw)
            images.append([sw.read_image(i).tobytes() for i in range(len(sizes))])
            with pytest.raises(TypeError, match="dtype='fp16'"):
                sw.step(grads, grad_dtype="fp16")
            assert sw.steps == 1
    assert images[0] == images[1]
    # bf16 bits as initial params are read as bf16 too.
    with NVMeOptimizerSwapper([7], tmp_path) as sw:
        sw.init_partition(0, grads[1])
        assert sw.get_state(0)["param"].tobytes() == _bf16_to_f32(grads[1]).tobytes()


def test_compact_files_hold_the_state_once_and_step_resumably(tmp_path, backend):
    """compact=True: one slot per partition plus min(count, buffer_count) spares per slot size;
    resumable steps equal a two-slot swapper's bit for bit, a plain step is refused by name, an
    abandoned step drops the stepped partitions (holds_state) until they are written again, and
    the I/O pass leaves the state as it was."""
    rng = np.random.default_rng(7)
    sizes = [5000, 5000, 5000, 77]
    init = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    kw = dict(buffer_count=2, backend=backend)
    two = NVMeOptimizerSwapper(sizes, tmp_path, name="two", **kw)
    one = NVMeOptimizerSwapper(sizes, tmp_path, name="one", compact=True, **kw)
    try:
        for sw in (two, one):
            for i, p in enumerate(init):
                sw.init_partition(i, p)
        slot = [-(-len(one.read_image(i)) // 4096) * 4096 for i in range(4)]
        assert one.compact and not two.compact
        assert one.file_bytes == sum(slot) + 2 * slot[0] + slot[3] == os.path.getsize(one.file_path)
        assert two.file_bytes == 2 * sum(slot)
        grads = [rng.standard_normal(n).astype(np.float32) for n in sizes]
        with pytest.raises(NativeError, match="resumable"):
            one.step(grads)
        for _ in range(3):
            grads = [rng.standard_normal(n).astype(np.float32) for n in sizes]
            two.step(grads, resumable=True)
            one.step(grads, resumable=True)
        assert all(np.array_equal(one.read_image(i), two.read_image(i)) for i in range(4))
        seconds = one.io_pass()
        assert seconds > 0 and all(np.array_equal(one.read_image(i), two.read_image(i)) for i in range(4))
        lib.zs_fault_set(b"swap.write", 3, 1, errcode("ZS_EIO"))
        try:
            with pytest.raises(NativeError, match="stopped partway"):
                one.step(grads, resumable=True)
        finally:
            lib.zs_fault_clear()
        assert one.incomplete_step == 4
        one.abandon_step()
        held = [one.holds_state(i) for i in range(4)]
        # 0 and 1 were stepped and written (3 may have been too); 2's write failed: it keeps step 3
        assert held[:3] == [False, False, True]
        with pytest.raises(NativeError, match="dropped"):
            one.read_image(0)
        for i in range(4):
            if not held[i]:
                one.write_image(i, two.read_image(i))
        assert all(np.array_equal(one.read_image(i), two.read_image(i)) for i in range(4))
        one.step(grads, resumable=True)
        two.step(grads, resumable=True)
        assert all(np.array_equal(one.read_image(i), two.read_image(i)) for i in range(4))
    finally:
        one.close()
        two.close()
