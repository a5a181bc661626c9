"""zspeed.ops.aio.AsyncIOHandle: DeepSpeed's aio_handle API on every backend
this machine has (an unavailable backend is skipped with the probe's
reason), on numpy arrays and (when torch is installed) CPU tensors."""
import os
import subprocess
import sys

import numpy as np
import pytest

from zspeed import NativeError
from zspeed.ops.aio import AsyncIOHandle, aio_backend

BACKENDS = ["io_uring", "threads", "iocp"]


def _handle(backend, **kw):
    try:
        aio_backend(backend)
    except NativeError as e:
        pytest.skip(f"{backend}: {e.detail}")
    return AsyncIOHandle(backend=backend, **kw)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def test_defaults_are_deepspeeds(backend):
    h = _handle(backend)
    assert h.get_block_size() == 1048576
    assert h.get_queue_depth() == 128
    assert h.get_single_submit() is False
    assert h.get_overlap_events() is False
    assert h.get_intra_op_parallelism() == 1 == h.get_thread_count()
    assert h.get_alignment() == 512
    assert h.backend == backend
    assert backend in h.backend_why
    h.close()


def test_numpy_roundtrip_unaligned(backend, tmp_path):
    rng = np.random.default_rng(1)
    h = _handle(backend, block_size=65536, queue_depth=8, intra_op_parallelism=2)
    path = str(tmp_path / "n.bin")
    data = rng.integers(0, 255, size=3 * 1048576 + 13, dtype=np.uint8)
    assert h.sync_pwrite(data, path) == 1
    # Many concurrent reads at random (unaligned) offsets into odd-sized arrays.
    outs = []
    for _ in range(20):
        off = int(rng.integers(0, data.size - 1))
        n = int(rng.integers(1, min(400_000, data.size - off) + 1))
        out = np.zeros(n, dtype=np.uint8)
        assert h.async_pread(out, path, off) == 0
        outs.append((off, out))
    assert h.wait() == 20
    for off, out in outs:
        np.testing.assert_array_equal(out, data[off:off + out.size])
    # A write at an offset keeps what is around it (no truncation).
    patch = rng.integers(0, 255, size=5000, dtype=np.uint8)
    assert h.async_pwrite(patch, path, 777) == 0
    assert h.wait() == 1
    back = np.empty_like(data)
    assert h.read(back, path, True) == 0  # validate=True compares with disk
    expect = data.copy()
    expect[777:777 + 5000] = patch
    np.testing.assert_array_equal(back, expect)
    st = h.stats()
    assert st["requests"] >= 23 and st["requests_failed"] == 0
    h.close()


def test_errors_leave_handle_usable(backend, tmp_path):
    h = _handle(backend)
    path = str(tmp_path / "e.bin")
    data = np.arange(10000, dtype=np.float32)
    h.write(data, path)
    out = np.empty(20000, dtype=np.float32)
    with pytest.raises(NativeError) as ei:
        h.sync_pread(out, path)
    assert ei.value.name == "ZS_EOF" and "end of the file" in ei.value.detail
    with pytest.raises(NativeError) as ei:
        h.sync_pread(out, str(tmp_path / "missing.bin"))
    assert ei.value.name == "ZS_ENOENT"
    # Asynchronous failures surface at wait(), which still collects the rest.
    ok = np.empty(10000, dtype=np.float32)
    h.async_pread(out, path, 0)
    h.async_pread(ok, path, 0)
    with pytest.raises(NativeError):
        h.wait()
    np.testing.assert_array_equal(ok, data)
    assert h.wait() == 0
    with pytest.raises(TypeError):
        h.sync_pread([1, 2, 3], path)
    with pytest.raises(ValueError):
        h.sync_pread(np.empty((4, 4), dtype=np.float32)[:, ::2], path)
    h.close()


def test_locked_numpy_buffers(backend, tmp_path):
    h = _handle(backend)
    buf = h.new_cpu_locked_tensor(1 << 18, np.empty(0, dtype=np.float32))
    assert buf.dtype == np.float32 and buf.size == 1 << 18
    assert buf.ctypes.data % 4096 == 0
    buf[:] = np.linspace(0, 1, buf.size, dtype=np.float32)
    path = str(tmp_path / "l.bin")
    h.sync_pwrite(buf, path)
    back = h.new_cpu_locked_tensor(1 << 18, np.empty(0, dtype=np.float32))
    h.sync_pread(back, path)
    np.testing.assert_array_equal(back, buf)
    assert h.free_cpu_locked_tensor(buf) and h.free_cpu_locked_tensor(back)
    assert not h.free_cpu_locked_tensor(np.empty(3))
    h.close()


def test_torch_tensors(backend, tmp_path):
    torch = pytest.importorskip("torch")
    h = _handle(backend, block_size=1 << 18)
    path = str(tmp_path / "t.bin")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(123457, generator=g)
    assert h.sync_pwrite(x, path) == 1
    y = torch.empty_like(x)
    assert h.async_pread(y, path) == 0 and h.wait() == 1
    assert torch.equal(x, y)
    locked = h.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.bfloat16))
    assert locked.dtype == torch.bfloat16 and locked.numel() == 1000
    locked.copy_(x[:1000].to(torch.bfloat16))
    h.sync_pwrite(locked, path, 4 * 123457)
    z = torch.zeros(1000, dtype=torch.bfloat16)
    h.sync_pread(z, path, 4 * 123457)
    assert torch.equal(z, locked)
    # The file-descriptor overload of async_pwrite.
    fd = os.open(str(tmp_path / "fd.bin"), os.O_RDWR | os.O_CREAT)
    try:
        if sys.platform.startswith("linux"):
            assert h.async_pwrite(x[:100], fd) == 0 and h.wait() == 1
            assert os.path.getsize(tmp_path / "fd.bin") == 400
    finally:
        os.close(fd)
    assert h.free_cpu_locked_tensor(locked)
    h.close()


def test_env_forces_backend():
    # ZSPEED_AIO_BACKEND overrides auto; an unusable one is a clear error.
    code = ("from zspeed.ops.aio import AsyncIOHandle\n"
            "print(AsyncIOHandle().backend)\n")
    env = dict(os.environ, ZSPEED_AIO_BACKEND="threads")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "threads"
    env["ZSPEED_AIO_BACKEND"] = "nonsense"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True)
    assert r.returncode != 0 and "ZSPEED_AIO_BACKEND" in r.stderr


def test_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, tempfile, os\n"
            "from zspeed.ops.aio import AsyncIOHandle\n"
            "h = AsyncIOHandle(); d = tempfile.mkdtemp()\n"
            "a = np.arange(10.0); h.sync_pwrite(a, os.path.join(d, 'x'))\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "ok"


def test_cuda_tensor_staged(tmp_path):
    # Runs on the GPU host: a CUDA tensor goes through a pinned host buffer.
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    h = AsyncIOHandle()
    path = str(tmp_path / "c.bin")
    x = torch.randn(1 << 20, device="cuda")
    assert h.sync_pwrite(x, path) == 1
    y = torch.zeros_like(x)
    assert h.async_pread(y, path) == 0 and h.wait() == 1
    assert torch.equal(x, y)
    h.close()


def test_bytes_like_and_ctypes_buffers(backend, tmp_path):
    """Any object with the buffer protocol is a buffer: bytes to write from;
    bytearray, memoryview, array.array and ctypes arrays to read into.
    Read-only memory is refused as a read target, non-contiguous views
    everywhere, each with a message that says so."""
    import array
    import ctypes
    h = _handle(backend)
    path = str(tmp_path / "b.bin")
    data = bytes(range(256)) * 41 + b"odd tail"
    assert h.sync_pwrite(data, path) == 1
    into = bytearray(len(data))
    h.sync_pread(into, path)
    assert bytes(into) == data
    c = (ctypes.c_ubyte * (len(data) - 3))()
    h.sync_pread(c, path, 3)
    assert bytes(c) == data[3:]
    mv = memoryview(bytearray(100))
    h.sync_pread(mv[10:60], path, 7)
    assert bytes(mv[10:60]) == data[7:57] and bytes(mv[:10]) == bytes(10)
    floats = array.array("f", bytes(400))
    h.sync_pread(floats, path)
    assert floats.tobytes() == data[:400]
    with pytest.raises(ValueError, match="buffer is read-only"):
        h.sync_pread(data, path)
    with pytest.raises(ValueError, match="not C-contiguous"):
        h.sync_pread(memoryview(into)[::2], path)
    h.close()


def test_one_message_per_mistake_everywhere(tmp_path):
    """aio, the NVMe swapper and the optimizers describe buffers through one
    adapter: the same mistake gets the same message in all three, only the
    buffer's name differs."""
    from zspeed.ops.adam import adam_step
    from zspeed.ops.swap import NVMeOptimizerSwapper
    n = 16
    ok = np.zeros(n, np.float32)

    def norm(e, name):  # the message with the buffer's name taken out
        return str(e.value).replace(name + " ", "X ", 1).replace(f"({name})", "(X)")
    mistakes = {
        "not contiguous": (ValueError, np.zeros((n, 2), np.float32)[:, 0]),
        "a list": (TypeError, [0.0] * n),
        "float64": (TypeError, np.zeros(n)),
    }
    h = AsyncIOHandle(backend="threads")
    with NVMeOptimizerSwapper([n], tmp_path, backend="threads") as sw:
        sw.init_partition(0, ok)
        for what, (exc, bad) in mistakes.items():
            msgs = []
            with pytest.raises(exc) as e:
                adam_step(ok.copy(), bad, ok.copy(), ok.copy(), step=1)
            msgs.append(norm(e, "grad"))
            with pytest.raises(exc) as e:
                sw.step([bad])
            msgs.append(norm(e, "grads[0]"))
            if what != "float64":  # raw I/O takes any element type
                with pytest.raises(exc) as e:
                    h.sync_pwrite(bad, str(tmp_path / "m.bin"))
                msgs.append(norm(e, "buffer"))
            assert len(set(msgs)) == 1, (what, msgs)
    h.close()
