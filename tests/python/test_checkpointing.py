"""zspeed.checkpointing (DeepSpeed's activation checkpointing API): checkpointed and plain
training give identical gradients, dropout included (the random state is restored for the
recomputation), with keyword arguments, several outputs and non-tensor outputs."""
import pytest

torch = pytest.importorskip("torch", reason="activation checkpointing needs torch")

from zspeed import checkpointing  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, d=19):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x, scale=1.0):
        return self.drop(torch.tanh(self.lin(x))) * scale


def _run(ckpt: bool, seed=0):
    torch.manual_seed(seed)
    blocks = torch.nn.ModuleList(Block() for _ in range(4))
    x = torch.randn(7, 19, requires_grad=True)
    torch.manual_seed(123)
    h = x
    for b in blocks:
        h = checkpointing.checkpoint(b, h, scale=0.5) if ckpt else b(h, scale=0.5)
    h.square().sum().backward()
    return [p.grad.clone() for p in blocks.parameters()] + [x.grad.clone()], h.detach()


def test_checkpointed_equals_plain_bit_for_bit():
    checkpointing.reset()
    g_plain, out_plain = _run(False)
    g_ckpt, out_ckpt = _run(True)
    assert torch.equal(out_plain, out_ckpt)
    for a, b in zip(g_plain, g_ckpt):
        assert torch.equal(a, b)


def test_configure_and_cpu_checkpointing_on_the_cpu_changes_nothing():
    """cpu_checkpointing moves GPU tensors; on the CPU the result is the same, bit for bit."""
    checkpointing.configure(None, partition_activations=True, checkpoint_in_cpu=True, synchronize=True,
                            profile=True)
    assert checkpointing.is_configured()
    g_plain, _ = _run(False)
    g_ckpt, _ = _run(True)
    for a, b in zip(g_plain, g_ckpt):
        assert torch.equal(a, b)
    checkpointing.reset()
    assert not checkpointing.is_configured()


def test_several_and_non_tensor_outputs_and_no_grad():
    lin = torch.nn.Linear(5, 5)

    def f(x):
        y = lin(x)
        return y, y.sum(), "tag", torch.arange(3)

    x = torch.randn(2, 5, requires_grad=True)
    y, s, tag, idx = checkpointing.checkpoint(f, x)
    assert tag == "tag" and idx.tolist() == [0, 1, 2] and not idx.is_floating_point()
    (y.sum() + s).backward()
    g = x.grad.clone()
    x.grad = None
    y2, s2, _, _ = f(x)
    (y2.sum() + s2).backward()
    assert torch.equal(g, x.grad)
    with torch.no_grad():
        out = checkpointing.checkpoint(f, x)
    assert out[2] == "tag"


def test_rng_tracker():
    tr = checkpointing.get_cuda_rng_tracker()
    checkpointing.model_parallel_cuda_manual_seed(1234)
    with tr.fork():
        a = torch.rand(3) if not torch.cuda.is_available() else torch.rand(3, device="cuda").cpu()
    with pytest.raises(ValueError, match="already tracked"):
        tr.add("model-parallel-rng", 99)
    with pytest.raises(ValueError, match="not tracked"):
        with tr.fork("nope"):
            pass
    checkpointing.model_parallel_cuda_manual_seed(1234)
    with tr.fork():
        b = torch.rand(3) if not torch.cuda.is_available() else torch.rand(3, device="cuda").cpu()
    assert torch.equal(a, b)
    tr.reset()


def test_mpu_is_refused():
    with pytest.raises(Exception, match="model parallelism"):
        checkpointing.configure(object())


def test_deepspeeds_module_path_is_the_same_module_and_detach_variable():
    """deepspeed.runtime.activation_checkpointing.checkpointing (as scripts import it) is this
    module: one configure() state; detach_variable as DeepSpeed's."""
    from zspeed.runtime.activation_checkpointing import checkpointing as by_path
    from zspeed.runtime.activation_checkpointing.checkpointing import checkpoint, detach_variable
    assert by_path is checkpointing and checkpoint is checkpointing.checkpoint
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(2)
    x, n, y = detach_variable((a * 2, 5, b))
    assert x.requires_grad and x.grad_fn is None and torch.equal(x, a * 2)
    assert n == 5 and not y.requires_grad and torch.equal(y, b)
    with pytest.raises(RuntimeError, match="tuple"):
        detach_variable([a])
