"""Integers at the C boundary: ctypes drops the high bits of a Python int that does not fit
its C type (2**64 + 4 becomes 4) and int() truncates floats, so the Python layer checks every
integer argument first (zspeed.ops._tensors.integer) and the library judges what it means.
A refused value changes nothing."""
import numpy as np
import pytest

from zspeed import NativeError
from zspeed.ops.adam import adam_step
from zspeed.ops.aio import AsyncIOHandle
from zspeed.ops.swap import NVMeOptimizerSwapper


def test_aio_offsets_never_wrap_or_truncate(tmp_path):
    h = AsyncIOHandle(backend="threads")
    path = str(tmp_path / "f.bin")
    base = np.arange(64, dtype=np.uint8)
    assert h.sync_pwrite(base, path, 0) == 1
    new = np.full(8, 255, np.uint8)
    with pytest.raises(ValueError, match=r"file_offset = 18446744073709551620 is out of range"):
        h.sync_pwrite(new, path, 2 ** 64 + 4)
    with pytest.raises(TypeError, match="file_offset must be an integer, not float"):
        h.sync_pwrite(new, path, 4.7)
    with pytest.raises(TypeError, match="file_offset must be an integer, not bool"):
        h.sync_pwrite(new, path, True)
    with pytest.raises(NativeError) as ei:  # in int64 but meaningless: the library's own error
        h.sync_pwrite(new, path, -4)
    assert ei.value.name == "ZS_EINVAL"
    assert np.array_equal(np.fromfile(path, np.uint8), base)  # nothing was written at offset 4
    assert h.sync_pwrite(new, path, np.int64(4)) == 1  # numpy integers are integers
    with pytest.raises(ValueError, match="num_elem"):
        h.new_cpu_locked_tensor(2 ** 62, np.zeros(1, np.float32))
    h.close()
    with pytest.raises(ValueError, match="block_size"):
        AsyncIOHandle(block_size=2 ** 64 + 65536, backend="threads")
    with pytest.raises(ValueError, match="queue_depth"):
        AsyncIOHandle(queue_depth=2 ** 32 + 8, backend="threads")
    with pytest.raises(TypeError, match="queue_depth"):
        AsyncIOHandle(queue_depth=8.0, backend="threads")


def test_adam_step_number_never_wraps():
    n = 37
    p = np.linspace(-1, 1, n, dtype=np.float32)
    g, m, v = np.ones(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32)
    before = p.copy()
    with pytest.raises(ValueError, match="step = 18446744073709551617 is out of range"):
        adam_step(p, g, m, v, step=2 ** 64 + 1)  # ctypes would pass 1
    with pytest.raises(TypeError, match="step must be an integer"):
        adam_step(p, g, m, v, step=2.5)
    assert np.array_equal(p, before) and not m.any() and not v.any()


def test_cpuadam_state_step_never_wraps():
    torch = pytest.importorskip("torch")
    from zspeed.ops.adam import CPUAdam
    w = torch.nn.Parameter(torch.linspace(-1, 1, 37))
    opt = CPUAdam([w], lr=0.1)
    w.grad = torch.ones(37)
    opt.step()
    before = w.detach().clone()
    for bad, err in ((2 ** 64, ValueError), (2 ** 63 - 1, ValueError), (-3, ValueError), (4.0, TypeError)):
        opt.state[w]["step"] = bad
        with pytest.raises(err, match=r"state\['step'\]"):
            opt.step()
        assert torch.equal(w.detach(), before)
    with pytest.raises(ValueError, match="num_threads"):
        CPUAdam([w], num_threads=2 ** 32 + 1)


def test_swapper_sizes_and_steps_never_wrap(tmp_path):
    with pytest.raises(ValueError, match=r"sizes\[1\] = 18446744073709551621 is out of range"):
        NVMeOptimizerSwapper([10, 2 ** 64 + 5], tmp_path, buffer_count=2)  # ctypes would make it 5
    with pytest.raises(ValueError, match="buffer_count"):
        NVMeOptimizerSwapper([10], tmp_path, buffer_count=2 ** 32 + 2)
    s = NVMeOptimizerSwapper([10], tmp_path, buffer_count=2)
    s.init_partition(0, np.ones(10, np.float32))
    for bad in (2 ** 64, -(2 ** 64)):
        with pytest.raises(ValueError, match="steps"):
            s.steps = bad
    with pytest.raises(NativeError, match=r"2\^63 - 2"):  # the next step's number would not exist
        s.steps = 2 ** 63 - 1
    s.steps = 2 ** 63 - 2
    with pytest.raises(ValueError, match="step"):
        s.step([np.ones(10, np.float32)], step=2 ** 64 + 1)
    with pytest.raises(TypeError, match="partition"):
        s.read_arrays(0.0, ["param"])
    assert s.steps == 2 ** 63 - 2
    s.close()
