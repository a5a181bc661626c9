"""NVMeOptimizerSwapper.read_arrays / write_arrays: a partition's arrays exactly as
stored (checked against the raw image at the offsets layout() reports), writes that
keep every array they do not name bit for bit, torch tensors, and refusals. The
first two tests run once per aio backend this machine has."""
import numpy as np
import pytest

from zspeed import NativeError
from zspeed.ops.swap import NVMeOptimizerSwapper
from test_swap import backend  # noqa: F401  (the per-backend fixture)

SIZES = [1031, 3, 777]
# (optimizer, state dtype) -> the arrays a partition has, with their stored numpy dtypes.
CASES = {
    ("adamw", "fp32"): {"param": np.float32, "exp_avg": np.float32, "exp_avg_sq": np.float32},
    ("adamw", "bf16"): {"param": np.float32, "exp_avg": np.uint16, "exp_avg_sq": np.uint16},
    ("adamw", "int8"): {"param": np.float32, "exp_avg": np.int8, "exp_avg_sq": np.uint8,
                        "exp_avg_scale": np.float32, "exp_avg_sq_scale": np.float32},
    ("adagrad", "fp32"): {"param": np.float32, "sum": np.float32},
    ("lion", "bf16"): {"param": np.float32, "exp_avg": np.uint16},
}
# name of an array -> its region in layout()
REGION = {"param": "param", "exp_avg": "m", "exp_avg_sq": "v", "sum": "v",
          "exp_avg_scale": "m_scale", "exp_avg_sq_scale": "v_scale"}


def _trained(tmp_path, opt, sd, name="a", backend="auto"):
    """A swapper after two steps on random gradients."""
    rng = np.random.default_rng(3)
    sw = NVMeOptimizerSwapper(SIZES, tmp_path, optimizer=opt, state_dtype=sd, name=name,
                              weight_decay=0.01, buffer_count=2, backend=backend)
    for i, n in enumerate(SIZES):
        sw.init_partition(i, rng.standard_normal(n).astype(np.float32))
    for _ in range(2):
        sw.step([rng.standard_normal(n).astype(np.float32) for n in SIZES])
    return sw


def _region(sw, i, key, nbytes):
    img, lay = sw.read_image(i), sw.layout(i)
    return img[lay[REGION[key]]:lay[REGION[key]] + nbytes]


@pytest.mark.parametrize("opt,sd", list(CASES))
def test_read_arrays_is_the_stored_image(tmp_path, opt, sd, backend):
    with _trained(tmp_path, opt, sd, backend=backend) as sw:
        for i, n in enumerate(SIZES):
            arrays = sw.read_arrays(i)
            assert {k: a.dtype for k, a in arrays.items()} == {k: np.dtype(t) for k, t in CASES[opt, sd].items()}
            for k, a in arrays.items():
                assert a.size == (n if "scale" not in k else (n + 255) // 256)
                assert a.tobytes() == _region(sw, i, k, a.nbytes).tobytes(), (i, k)
            # The converting view agrees: fp32 copies, bf16 widened, states as the kernel sees them.
            st = sw.get_state(i)
            assert np.array_equal(st["param"], arrays["param"])
            if sd != "int8":
                for k in sw.state_keys:
                    a = arrays[k]
                    wide = (a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a
                    assert np.array_equal(st[k], wide), k
            assert set(sw.read_arrays(i, ["param"])) == {"param"}


@pytest.mark.parametrize("opt,sd", list(CASES))
def test_write_keeps_unnamed_arrays_bit_for_bit(tmp_path, opt, sd, backend):
    rng = np.random.default_rng(5)
    with _trained(tmp_path, opt, sd, backend=backend) as sw, \
            _trained(tmp_path, opt, sd, name="b", backend=backend) as other:
        for i, n in enumerate(SIZES):
            before = sw.read_arrays(i)
            new = rng.standard_normal(n).astype(np.float32)
            sw.write_arrays(i, param=new)
            after = sw.read_arrays(i)
            assert np.array_equal(after["param"], new)
            for k in before:
                if k != "param":
                    assert after[k].tobytes() == before[k].tobytes(), k
            # Every array into another swapper: the same raw image.
            other.write_arrays(i, **after)
            assert other.read_image(i).tobytes() == sw.read_image(i).tobytes()


def test_torch_tensors_and_refusals(tmp_path):
    torch = pytest.importorskip("torch")
    with _trained(tmp_path, "adamw", "bf16") as a, _trained(tmp_path, "adamw", "bf16", name="b") as b:
        arr = a.read_arrays(0)
        as_torch = {"param": torch.from_numpy(arr["param"]),
                    "exp_avg": torch.from_numpy(arr["exp_avg"].view(np.int16)).view(torch.bfloat16),
                    "exp_avg_sq": torch.from_numpy(arr["exp_avg_sq"].view(np.int16)).view(torch.bfloat16)}
        b.write_arrays(0, **as_torch)
        assert b.read_image(0).tobytes() == a.read_image(0).tobytes()
        before = b.read_image(0).tobytes()
        with pytest.raises(ValueError, match="unknown array"):
            b.write_arrays(0, sum=arr["param"])
        with pytest.raises(TypeError, match="stores it as uint16"):
            b.write_arrays(0, exp_avg=arr["param"])  # fp32 values for bf16 states: not converted
        with pytest.raises(ValueError, match="elements"):
            b.write_arrays(0, param=arr["param"][:-1])
        with pytest.raises(ValueError, match="unknown array"):
            b.read_arrays(0, ["exp_avg_scale"])
        assert b.read_image(0).tobytes() == before
    with _trained(tmp_path, "adamw", "int8") as q:
        codes = q.read_arrays(1, ["exp_avg", "exp_avg_scale"])
        with pytest.raises(NativeError, match="block scales") as ei:
            q.write_arrays(1, exp_avg=codes["exp_avg"])  # codes without their scales
        assert ei.value.name == "ZS_EINVAL"
        with pytest.raises(NativeError, match="block scales"):
            q.read_arrays(1, ["exp_avg_sq"])
        q.write_arrays(1, **codes)  # together: accepted
