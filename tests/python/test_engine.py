"""The engine against plain PyTorch training (CPU only, small models, odd sizes)."""
import os

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch (pip install torch)")

import zspeed

# These tests compare against CPU references: keep the engine on the CPU on GPU machines too.
from zspeed.runtime.config import ConfigError
from engine_helpers import OFFLOAD, config as cfg, mlp, native_ops_available, regression_data as batches, \
    train


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """CPU-only by design (the engine's API tests compare with CPU-built references): ZSPEED_DEVICE=cpu for each test,
    also under tests/gpu/gate.py (per test, so that other files keep the GPU)."""
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")

F = torch.nn.functional


def train_ref(model, data, steps, lr=2e-2, wd=0.01, clip=0.0):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    losses = []
    for i in range(steps):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("mode", ["device", "offload_torch", "offload_native"])
def test_matches_pytorch_adamw_60_steps(mode):
    if mode == "offload_native" and not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available: libzspeed not built or ops not merged")
    data = batches(60)
    ref = mlp()
    train_ref(ref, data, 60, clip=1.0)  # the config leaves gradient_clipping at DeepSpeed's default, 1.0
    c = cfg()
    if mode != "device":
        c["zero_optimization"] = OFFLOAD
        if mode == "offload_torch":
            c["optimizer"]["params"]["torch_adam"] = True
    engine, opt, _, _ = zspeed.initialize(model=mlp(), config=c)
    losses = train(engine, data, 60)
    if mode == "offload_native":
        # The C kernel evaluates AdamW in fp32 with its own operation order (fused multiply-adds,
        # SIMD reductions): per-step differences of a few ulp that 60 steps of training amplify
        # mildly; the bound below is far below one step's update (lr 2e-2).
        # Measured: max abs difference 3.6e-7 after 60 steps.
        tol = dict(rtol=1e-5, atol=2e-6)
    else:
        # torch AdamW on the same fp32 values (offloaded: its fused CPU kernel, which rounds a few
        # operations differently, ~1 ulp per step): agreement to ~1e-6 after 60 steps.
        tol = dict(rtol=1e-5, atol=1e-6)
    for a, b in zip(ref.parameters(), engine.module.parameters()):
        torch.testing.assert_close(b, a, **tol)
    assert losses[-1] < losses[0] * 0.8  # it actually trained
    assert engine.global_steps == 60 and engine.skipped_steps == 0


@pytest.mark.parametrize("offload", [False, True])
def test_gradient_accumulation_equivalence(offload):
    # 4 micro-batches of 3 with GAS 4 == one batch of 12: same mean-loss gradient.
    big = batches(10, bs=12, seed=5)
    c_big = cfg(train_micro_batch_size_per_gpu=12)
    c_acc = cfg(train_micro_batch_size_per_gpu=3, gradient_accumulation_steps=4)
    if offload:
        for c in (c_big, c_acc):
            c["zero_optimization"] = OFFLOAD
            c["optimizer"]["params"]["torch_adam"] = True
    e1, *_ = zspeed.initialize(model=mlp(), config=c_big)
    e2, *_ = zspeed.initialize(model=mlp(), config=c_acc)
    assert e2.train_batch_size() == 12 and e2.gradient_accumulation_steps() == 4
    boundaries = []
    for x, y in big:
        e1.backward(F.mse_loss(e1(x), y))
        e1.step()
        for k in range(4):
            boundaries.append(e2.is_gradient_accumulation_boundary())
            e2.backward(F.mse_loss(e2(x[3 * k:3 * k + 3]), y[3 * k:3 * k + 3]))
            e2.step()
    assert boundaries[:8] == [False, False, False, True] * 2
    assert e1.global_steps == e2.global_steps == 10 and e2.micro_steps == 40
    for a, b in zip(e1.module.parameters(), e2.module.parameters()):
        # Summing four partial means instead of one mean changes fp32 rounding only (~1e-7 relative);
        # ten Adam steps keep that well under 1e-5.
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("offload", [False, True])
def test_clipping_matches_clip_grad_norm(offload):
    data = batches(25, seed=7)
    ref = mlp()
    for x, y in data:  # scale targets up so gradients exceed the clip threshold
        y.mul_(20)
    train_ref(ref, data, 25, clip=0.5)
    c = cfg(gradient_clipping=0.5)
    if offload:
        c["zero_optimization"] = OFFLOAD
        c["optimizer"]["params"]["torch_adam"] = True
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    train(e, data, 25)
    assert e.get_global_grad_norm() > 0.5  # clipping was active
    for a, b in zip(ref.parameters(), e.module.parameters()):
        # Same coefficient formula (max_norm / (norm + 1e-6)); the norm is accumulated in float64 here
        # and in fp32 by torch: relative differences ~1e-7 in the coefficient.
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_gradient_clipping_defaults_to_deepspeeds_1_and_0_turns_it_off():
    # DeepSpeed's default is 1.0 since 0.19.3 (runtime/constants.py GRADIENT_CLIPPING_DEFAULT): a
    # config without the key clips at 1.0, "gradient_clipping": 0 does not clip.
    data = batches(12, seed=7)
    for x, y in data:  # targets scaled up so the gradient norm is well above 1
        y.mul_(20)
    clipped, unclipped = mlp(), mlp()
    train_ref(clipped, data, 12, clip=1.0)
    train_ref(unclipped, data, 12)
    for conf, ref in ((cfg(), clipped), (cfg(gradient_clipping=0), unclipped)):
        e, *_ = zspeed.initialize(model=mlp(), config=conf)
        assert e.gradient_clipping() == (1.0 if ref is clipped else 0.0)
        train(e, data, 12)
        assert e.get_global_grad_norm() > 1.0
        for a, b in zip(ref.parameters(), e.module.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)  # as in the test above
    from zspeed.runtime.config import get_gradient_clipping
    assert get_gradient_clipping({}) == 1.0 and get_gradient_clipping({"gradient_clipping": 0.5}) == 0.5


@pytest.mark.parametrize("offload", [False, True])
def test_bf16_keeps_fp32_masters(offload):
    c = cfg(bf16={"enabled": True}, gradient_clipping=0)  # the reference below does not clip
    if offload:
        c["zero_optimization"] = OFFLOAD
        c["optimizer"]["params"]["torch_adam"] = True
    e, opt, _, _ = zspeed.initialize(model=mlp(), config=c)
    assert all(p.dtype == torch.bfloat16 for p in e.module.parameters())
    assert all(p.dtype == torch.float32 for g in opt.param_groups for p in g["params"])
    # Reference: bf16 model, fp32 masters, torch AdamW, written out by hand.
    ref = mlp().to(torch.bfloat16)
    masters = [p.detach().float().clone() for p in ref.parameters()]
    ropt = torch.optim.AdamW(masters, lr=2e-2, weight_decay=0.01)
    data = batches(20, seed=9)
    for x, y in data:
        loss = F.mse_loss(ref(x.bfloat16()).float(), y)
        loss.backward()
        for m, p in zip(masters, ref.parameters()):
            m.grad = p.grad.float()
            p.grad = None
        ropt.step()
        with torch.no_grad():
            for m, p in zip(masters, ref.parameters()):
                p.copy_(m)
    train(e, data, 20)
    if offload:
        # Offloaded, torch's fused CPU AdamW kernel runs instead of the for-loop one: fp32 results
        # may differ in the last bit or two per step, and a bf16 weight by at most one bf16 ulp.
        wtol, mtol = dict(rtol=2 ** -7, atol=1e-6), dict(rtol=1e-5, atol=1e-7)
    else:  # identical arithmetic on identical values
        wtol, mtol = dict(rtol=0, atol=0), dict(rtol=0, atol=0)
    for a, b in zip(ref.parameters(), e.module.parameters()):
        torch.testing.assert_close(b, a, **wtol)
    for m, b in zip(masters, [p for g in opt.param_groups for p in g["params"]]):
        torch.testing.assert_close(b.view(m.shape), m, **mtol)


def test_initialize_api_and_dataloader(tmp_path):
    import json
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_batch_size": 8, "gradient_accumulation_steps": 2,
                             "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                             "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}}}))

    class Args:
        deepspeed_config = str(p)
        local_rank = 0

    ds = torch.utils.data.TensorDataset(torch.randn(20, 13), torch.randn(20, 5))
    e, opt, dl, sched = zspeed.initialize(args=Args(), model=mlp(), model_parameters=None,
                                          training_data=ds)
    assert e.train_micro_batch_size_per_gpu() == 4 and e.train_batch_size() == 8
    assert opt is e.optimizer and sched is e.lr_scheduler and dl is e.training_dataloader
    assert len(dl) == 5
    assert e.get_lr() == [0.0]  # WarmupLR starts at warmup_min_lr
    e.eval()
    assert not e.module.training
    e.train()
    assert e.module.training
    for x, y in dl:
        e.backward(F.mse_loss(e(x), y))
        e.step()
    assert e.global_steps == 2 and e.micro_steps == 5 and e.global_samples == 16
    assert isinstance(zspeed.ZSpeedEngine, type) and e.zero_optimization_stage() == 0


def test_client_optimizer_and_scheduler():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched_fn = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)  # noqa: E731
    e, o, _, s = zspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched_fn,
                                   config={"train_batch_size": 6})
    assert o is opt and isinstance(s, torch.optim.lr_scheduler.StepLR)
    train(e, batches(4), 4)
    assert e.get_lr() == [pytest.approx(0.025)]
    # bf16: as in DeepSpeed, the engine's optimizer wraps the client's, which now holds the fp32
    # masters (the same object, so a scheduler built on it keeps working).
    model = mlp()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    e, o, _, _ = zspeed.initialize(model=model, optimizer=sgd,
                                   config={"train_batch_size": 6, "bf16": {"enabled": True}})
    assert o.optimizer is sgd and o.param_groups[0]["params"][0].dtype == torch.float32
    train(e, batches(2), 2)


def test_client_optimizer_with_offload():
    model = mlp()
    c = {"train_batch_size": 6, "zero_optimization": OFFLOAD}
    from zspeed.runtime.zero.utils import ZeRORuntimeException
    with pytest.raises(ConfigError, match="zero_force_ds_cpu_optimizer") as info:
        zspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=c)
    assert isinstance(info.value, ZeRORuntimeException)  # the class DeepSpeed raises
    c["zero_force_ds_cpu_optimizer"] = False
    model = mlp()
    e, o, _, _ = zspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                   config=c)
    losses = train(e, batches(1), 30)
    assert losses[-1] < losses[0]


def test_engine_errors():
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        zspeed.initialize(model="nope", config=cfg())
    frozen = mlp()
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ConfigError, match="nothing to train"):
        zspeed.initialize(model=frozen, config=cfg())
    with pytest.raises(ConfigError, match="not a parameter of the model"):
        zspeed.initialize(model=mlp(), model_parameters=[torch.nn.Parameter(torch.zeros(2))], config=cfg())
    with pytest.raises(ConfigError, match="both in the config and as lr_scheduler"):
        zspeed.initialize(model=mlp(), lr_scheduler=lambda o: None,
                          config=cfg(scheduler={"type": "WarmupLR"}))
    e, *_ = zspeed.initialize(model=mlp(), config=cfg())
    with pytest.raises(ValueError, match="scalar loss"):
        e.backward(torch.ones(3, requires_grad=True))


@pytest.mark.parametrize("name,params", [("Adam", {"adam_w_mode": False, "weight_decay": 0.1}),
                                         ("Adagrad", {"lr": 0.05}), ("Lion", {"lr": 1e-3})])
def test_other_optimizers_train(name, params):
    e, opt, _, _ = zspeed.initialize(model=mlp(), config=cfg(optimizer={"type": name, "params": params}))
    losses = train(e, batches(1), 40)
    assert losses[-1] < losses[0] * 0.9
    if name == "Adam":
        assert type(opt) is torch.optim.Adam


def test_lion_matches_formula():
    from zspeed.runtime.optimizers import TorchLion
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(17, dtype=torch.float64))
    ref = p.detach().clone()
    m = torch.zeros_like(ref)
    o = TorchLion([p], lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    for _ in range(5):
        g = torch.randn(17, dtype=torch.float64)
        p.grad = g.clone()
        o.step()
        upd = torch.sign(0.9 * m + 0.1 * g)
        ref = ref * (1 - 0.01 * 0.1) - 0.01 * upd
        m = 0.99 * m + 0.01 * g
    torch.testing.assert_close(p.detach(), ref, rtol=1e-12, atol=1e-12)


def test_unused_parameter_and_named_parameters():
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(13, 5)
            self.unused = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.a(x)

    for c in (cfg(), cfg(zero_optimization=OFFLOAD)):
        if "zero_optimization" in c:
            c["optimizer"]["params"]["torch_adam"] = True
        torch.manual_seed(0)
        model = TwoHeads()
        w0 = model.unused.weight.detach().clone()
        e, *_ = zspeed.initialize(model=model, model_parameters=model.named_parameters(), config=c)
        train(e, batches(3), 3)
        # AdamW with zero gradient still applies weight decay to the unused layer (as torch does when
        # a zero grad is present), so only check it stayed finite and close.
        assert torch.isfinite(model.unused.weight).all()
        assert (model.unused.weight - w0).abs().max() < 1e-3


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_synchronous_offloaded_step_publishes_each_unit_as_its_chunk_is_stepped(precision):
    """The new weights of a unit reach the model as soon as the chunk holding its last piece is
    stepped, not after the whole step (on CUDA their copy then runs while the CPU steps the next
    chunks; on the CPU the optimizer writes the parameters' own storage): when chunk k starts,
    the parameters of chunks 0..k-1 hold their new weights and those of chunks k.. the old ones."""
    top = {"bf16": {"enabled": True}} if precision == "bf16" else {}
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(zero_optimization={
        "stage": 2, "sub_group_size": 100, "offload_optimizer": {"device": "cpu"}}, **top))
    path = e.optimizer_path
    chunks = path.chunks
    assert len(chunks) == 4
    model_p = {(gi, pi): p for gi, ps in enumerate(path.layout.params) for pi, p in enumerate(ps)}
    before = {k: p.detach().clone() for k, p in model_p.items()}
    seen, events = [], []
    step, publish = path.host.step, path.buffers._publish

    def spy(*args, **kw):
        seen.append({k: p.detach().clone() for k, p in model_p.items()})  # (stream-ordered reads on CUDA)
        events.append("step")
        return step(*args, **kw)

    def spy_publish(i, gi, ui, *rest):
        events.append((gi, ui))
        return publish(i, gi, ui, *rest)
    path.host.step, path.buffers._publish = spy, spy_publish
    x, y = batches(1)[0]
    p0 = next(e.module.parameters())
    e.backward(F.mse_loss(e(x.to(p0.device, p0.dtype)).float(), y.to(p0.device)))
    e.step()
    assert len(seen) == len(chunks)
    for k, snap in enumerate(seen):
        for c, keys in enumerate(chunks):
            for key in keys:
                changed = not torch.equal(snap[key], before[key])
                assert changed == (c < k), (k, c, key)
    assert all(not torch.equal(p.detach(), before[k]) for k, p in model_p.items())
    # (on the CPU the optimizer wrote the parameters themselves: the order of the publishes shows it)
    units = path.buffers.entry_units()
    want = []
    for keys in chunks:
        want += ["step"] + [units[gi][ei] for gi, ei in keys]  # one parameter per unit on one rank
    assert events == want


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_host_step_runs_each_chunk_of_a_group_as_one_kernel_call(precision, monkeypatch):
    """The host path's optimizer states lie end to end per group (flatten_states), as its masters,
    gradient and weight buffers do, so each chunk of a group is one call of the CPU kernel rather
    than one per parameter; the weights equal those of a step with one call per parameter bit
    for bit."""
    if not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")
    from zspeed.ops import _kernels
    top = {"bf16": {"enabled": True}} if precision == "bf16" else {}
    c = cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}, **top)
    calls = []
    real = _kernels.adam
    monkeypatch.setattr(_kernels, "adam", lambda *a, **k: calls.append(a[0].numel()) or real(*a, **k))
    torch.manual_seed(0)
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    path = e.optimizer_path
    train(e, batches(3), 3)
    runs = sum(len({gi for gi, _ in keys}) for keys in path.chunks)
    n_params = sum(len(ps) for ps in path.layout.params)
    assert len(calls) == 3 * runs < 3 * n_params
    assert sum(calls) == 3 * sum(path.layout.totals)
    # the same training with one kernel call per parameter
    torch.manual_seed(0)
    ref, *_ = zspeed.initialize(model=mlp(), config=c)
    ref.optimizer_path.host.optimizer.lay_out_states = False
    calls.clear()
    train(ref, batches(3), 3)
    assert len(calls) == 3 * n_params
    for a, b in zip(e.module.parameters(), ref.module.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("native", [False, True])
def test_chunked_offload_step_is_identical(native):
    # sub_group_size splits the CPU step into chunks (each followed by its copy back); per-parameter
    # updates are independent, so any chunking must give bit-identical results.
    if native and not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")
    data = batches(8, seed=11)
    out = []
    for sub in (1_000_000_000, 100):
        c = cfg(bf16={"enabled": True}, zero_optimization={"stage": 2, "sub_group_size": sub,
                                                            "offload_optimizer": {"device": "cpu"}})
        c["optimizer"]["params"]["torch_adam"] = not native
        e, *_ = zspeed.initialize(model=mlp(), config=c)
        assert len(e.optimizer_path.chunks) == (1 if sub > 1000 else 4)
        train(e, data, 8)
        out.append([p.detach().clone() for p in e.module.parameters()])
    for a, b in zip(*out):
        assert torch.equal(a, b)
