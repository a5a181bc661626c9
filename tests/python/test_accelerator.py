"""zspeed.accelerator: DeepSpeed's get_accelerator() for the CPU and CUDA."""
import pytest

torch = pytest.importorskip("torch", reason="zspeed.accelerator needs torch")

from zspeed import accelerator  # noqa: E402


def test_cpu_accelerator_answers_what_scripts_ask(monkeypatch):
    monkeypatch.setattr(accelerator, "_accelerator", None)
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")
    acc = accelerator.get_accelerator()
    assert acc is accelerator.get_accelerator()  # decided once
    assert acc.device_name() == "cpu" and acc.device_name(0) == "cpu" and acc.current_device_name() == "cpu"
    assert acc.is_available() and acc.is_bf16_supported() and acc.device_count() >= 1
    assert acc.communication_backend_name() == "gloo"
    acc.set_device(0)
    acc.synchronize()
    before = acc.memory_allocated()
    big = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB, touched
    assert acc.memory_allocated() > before and acc.max_memory_allocated() >= acc.memory_allocated()
    del big
    assert torch.float32 in acc.supported_dtypes() and torch.bfloat16 in acc.supported_dtypes()
    assert acc.FloatTensor is torch.FloatTensor
    with acc.stream(acc.Stream()):
        ev = acc.Event()
        ev.record()
    assert acc.total_memory() > 0 and acc.on_accelerator(torch.zeros(1))
    acc.manual_seed(3)
    a = torch.rand(2)
    acc.manual_seed(3)
    assert torch.equal(a, torch.rand(2))


def test_op_builders_are_a_clear_error(monkeypatch):
    monkeypatch.setattr(accelerator, "_accelerator", None)
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")
    with pytest.raises(NotImplementedError, match="DeepSpeedCPUAdam"):
        accelerator.get_accelerator().create_op_builder("CPUAdamBuilder")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_accelerator(monkeypatch):
    monkeypatch.setattr(accelerator, "_accelerator", None)
    monkeypatch.delenv("ZSPEED_DEVICE", raising=False)
    acc = accelerator.get_accelerator()
    assert acc.device_name() == "cuda" and acc.device_name(0) == "cuda:0"
    assert acc.communication_backend_name() in ("nccl", "gloo")
