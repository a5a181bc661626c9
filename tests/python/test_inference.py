"""zspeed.init_inference: the model's outputs and generations with weights streamed from host
memory equal the plain model's (fp32 on the CPU: the same kernels on the same weights, so
equal bit for bit; bf16: equal to the plain model cast to bf16). ZSPEED_DEVICE=cuda runs it
on a GPU (tests/gpu)."""
from __future__ import annotations

import copy
import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, HERE)
from gpt import GPT, GPTConfig  # noqa: E402
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError  # noqa: E402

DEV = torch.device(os.environ.get("ZSPEED_DEVICE", "cpu"))
OFFLOAD = {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True},
           "stage3_param_persistence_threshold": 0}


def _gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=61, max_len=32, d_model=48, n_layer=3, n_head=4))


@pytest.mark.parametrize("zero", [OFFLOAD, {"stage": 3}, {}], ids=["offload_param-cpu", "stage3-gpu", "plain"])
def test_outputs_and_generation_equal_the_plain_model(zero):
    ref = _gpt().to(DEV).eval()
    engine = zspeed.init_inference(_gpt(), config={"dtype": torch.float32, "zero": zero})
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(3)).to(DEV)
    with torch.no_grad():
        want = ref(ids)
    got = engine(ids)
    assert torch.equal(got, want)
    g1, g2 = torch.Generator(device=DEV).manual_seed(5), torch.Generator(device=DEV).manual_seed(5)
    assert torch.equal(engine.module.generate(ids, 6, generator=g1), ref.generate(ids, 6, generator=g2))
    if zero is OFFLOAD:  # between forwards no weight is on the device
        assert all(p.numel() == 0 for p in engine.module.parameters())


def test_bf16_and_the_guides_zero_optimization_spelling():
    ref = copy.deepcopy(_gpt()).to(DEV, torch.bfloat16).eval()
    engine = zspeed.init_inference(_gpt(), config={"dtype": "bf16", "zero_optimization": dict(
        OFFLOAD, stage3_param_persistence_threshold=1e5, stage3_max_live_parameters=1e7)})
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(4)).to(DEV)
    with torch.no_grad():
        assert torch.equal(engine(ids), ref(ids))


@pytest.mark.parametrize("cfg,match", [
    ({"replace_with_kernel_inject": True}, "kernel injection"),
    ({"kernel_inject": True}, "kernel injection"),
    ({"tensor_parallel": {"tp_size": 2}}, "tensor parallelism"),
    ({"mp_size": 2}, "tensor parallelism"),
    ({"enable_cuda_graph": True}, "enable_cuda_graph"),
    ({"dtype": "int4"}, "dtype"),
    ({"zero": {"stage": 2, "offload_param": {"device": "cpu"}}}, "stage"),
    ({"zero": {"stage": 3, "offload_param": {"device": "nvme"}}}, "nvme_path is required"),
    ({"zero": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/no/such/dir"}}},
     "not an existing writable directory"),
    ({"zero": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp", "buffer_cnt": 2}}},
     r"offload_param keys \['buffer_cnt'\]"),
    ({"windows_optimization": True}, "unknown config key"),
])
def test_unsupported_keys_are_refused_with_what_to_use(cfg, match):
    with pytest.raises(ConfigError, match=match):
        zspeed.init_inference(_gpt(), config=cfg)


def _nvme(tmp, **kw):
    return {"stage": 3, "stage3_param_persistence_threshold": 0,
            "offload_param": {"device": "nvme", "nvme_path": str(tmp), "pin_memory": True, "max_in_cpu": 0,
                              "buffer_count": 2, **kw}}


@pytest.mark.parametrize("kw", [{}, {"max_in_cpu": 3000}, {"buffer_count": 1}], ids=["all-on-nvme", "some-in-cpu",
                                                                                    "one-buffer"])
def test_weights_on_nvme_give_the_plain_models_outputs(tmp_path, kw):
    ref = _gpt().to(DEV).eval()
    engine = zspeed.init_inference(_gpt(), config={"dtype": torch.float32, "zero": _nvme(tmp_path, **kw)})
    files = [n for n in os.listdir(tmp_path) if n.endswith("_param.swap")]
    assert len(files) == 1 and engine._sm.on_disk_elems > 0
    if "max_in_cpu" in kw:
        assert 0 < engine._sm.resident_elems <= kw["max_in_cpu"]
    else:
        assert engine._sm.resident_elems == 0
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(3)).to(DEV)
    with torch.no_grad():
        want = ref(ids)
    for _ in range(2):  # the second forward prefetches along the recorded order
        assert torch.equal(engine(ids), want)
        assert all(p.numel() == 0 for p in engine.module.parameters())
    g1, g2 = torch.Generator(device=DEV).manual_seed(5), torch.Generator(device=DEV).manual_seed(5)
    assert torch.equal(engine.module.generate(ids, 6, generator=g1), ref.generate(ids, 6, generator=g2))
    engine.close()
    assert not [n for n in os.listdir(tmp_path) if n.endswith("_param.swap")]


@pytest.mark.parametrize("piece", [1, 2, 4])
def test_a_failed_nvme_read_raises_and_the_next_forward_is_right(tmp_path, piece):
    from zspeed import NativeError
    from zspeed._native import errcode, lib
    ref = _gpt().to(DEV).eval()
    engine = zspeed.init_inference(_gpt(), config={"dtype": torch.float32, "zero": _nvme(tmp_path)})
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(3)).to(DEV)
    assert torch.equal(engine(ids), ref(ids).detach())
    lib.zs_fault_set(b"aio.io", piece, 1, errcode("ZS_EIO"))
    try:
        with pytest.raises(NativeError, match="reading the shard of a parameter"):
            engine(ids)
    finally:
        lib.zs_fault_clear()
    with torch.no_grad():
        assert torch.equal(engine(ids), ref(ids))
    engine.close()


@pytest.mark.skipif(sys.platform == "win32" or DEV.type != "cpu", reason="reads the peak RSS of a CPU run")
def test_handing_the_weights_over_holds_the_model_about_once(tmp_path):
    # The host shards are filled while each parameter is freed once copied: the peak is about
    # one model, not the model plus a second, whole copy (which the first version took).
    r = eh.run_script(
        tmp_path, "peak.py",
        "import resource, torch\n"
        "import zspeed\n"
        "def peak():\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
        "with torch.no_grad():\n"
        "    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False) for _ in range(24)])\n"
        "    for p in model.parameters():\n"
        "        p.fill_(0.5)\n"
        "size = sum(p.numel() * 4 for p in model.parameters())\n"
        "base = peak()\n"
        "engine = zspeed.init_inference(model, config={'dtype': torch.float32, 'zero': {'stage': 3, "
        "'offload_param': {'device': 'cpu'}}})\n"
        "print((peak() - base) / size)\n", timeout=300, env={"ZSPEED_DEVICE": "cpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    extra = float(r.stdout.strip().splitlines()[-1])
    assert extra < 0.5, f"handing over a {24 * 16} MiB model raised the peak by {extra:.2f} models"
