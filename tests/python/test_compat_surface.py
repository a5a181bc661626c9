"""The DeepSpeed names scripts import or call at start-up, through zspeed's public API:
zspeed.utils, runtime.zero / offload_config, moe.utils, pipe, checkpoint.utils, the
version attributes, DeepSpeed's optimizer classes (against float64 references on odd
sizes) and the fd= keyword of async_pwrite."""
import logging
import os

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

import zspeed
from zspeed import utils
from zspeed.checkpoint.utils import clone_tensors_for_torch_save
from zspeed.moe.layer import MoE, MoENotSupported
from zspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from zspeed.pipe import LayerSpec, PipelineModule, PipelineNotSupported, TiedLayerSpec
from zspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum


# -- zspeed.utils ------------------------------------------------------------------------------
def test_repeating_loader_restarts_each_pass():
    loader = torch.utils.data.DataLoader(list(range(5)), batch_size=2)
    it = iter(utils.RepeatingLoader(loader))
    got = [next(it).tolist() for _ in range(7)]
    assert got == [[0, 1], [2, 3], [4], [0, 1], [2, 3], [4], [0, 1]]


def test_instrument_w_nvtx_wraps_each_call_in_a_range(monkeypatch):
    from zspeed.utils import nvtx
    calls = []

    class Plain:  # zspeed's accelerators: range_push(msg) / range_pop()
        def range_push(self, msg):
            calls.append(("push", msg))

        def range_pop(self):
            calls.append(("pop",))

    class WithDomain(Plain):
        supports_nvtx_domain = True

        def range_push(self, msg, domain=None):
            calls.append(("push", msg, domain))

        def range_pop(self, domain=None):
            calls.append(("pop", domain))

    def work(x):
        if x < 0:
            raise ValueError("negative")
        return x * 2

    monkeypatch.setattr(nvtx, "get_accelerator", Plain)
    monkeypatch.setattr(nvtx, "is_compiling", lambda: False)
    f = utils.instrument_w_nvtx(work)
    assert f(3) == 6 and f.__name__ == "work"
    with pytest.raises(ValueError):
        f(-1)  # the range is closed on the way out
    q = "test_instrument_w_nvtx_wraps_each_call_in_a_range.<locals>.work"
    assert calls == [("push", q), ("pop",), ("push", q), ("pop",)]
    calls.clear()
    monkeypatch.setattr(nvtx, "get_accelerator", WithDomain)
    assert f(1) == 2 and calls == [("push", q, "DeepSpeed"), ("pop", "DeepSpeed")]
    calls.clear()
    monkeypatch.setattr(nvtx, "is_compiling", lambda: True)  # no range while torch.compile traces
    assert f(1) == 2 and calls == []
    monkeypatch.setattr(nvtx, "is_compiling", lambda: False)
    monkeypatch.setattr(nvtx, "enable_nvtx", False)
    assert f(1) == 2 and calls == []
    monkeypatch.undo()
    assert utils.instrument_w_nvtx(work)(2) == 4  # this machine's own accelerator


def test_repeating_loader_of_nothing_stops():
    with pytest.raises(StopIteration):
        next(utils.RepeatingLoader([]))


def test_log_dist_follows_deepspeeds_rank_rule(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="zspeed")
    from zspeed.runtime import logs  # (what deepspeed.utils.logging re-exports)
    monkeypatch.setattr(logs, "_rank", lambda: None)  # no process group: everyone logs
    utils.log_dist("alone", ranks=[0])
    monkeypatch.setattr(logs, "_rank", lambda: 1)
    utils.log_dist("for rank 0", ranks=[0])
    utils.log_dist("for nobody")
    utils.log_dist("for all", ranks=[-1])
    utils.log_dist("for rank 1", ranks=[0, 1], level=logging.WARNING)
    msgs = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "zspeed"]
    assert msgs == [(logging.INFO, "[Rank -1] alone"), (logging.INFO, "[Rank 1] for all"),
                    (logging.WARNING, "[Rank 1] for rank 1")]


def test_log_dist_once_and_warning_once(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="zspeed")
    from zspeed.runtime import logs
    monkeypatch.setattr(logs, "_rank", lambda: None)
    for _ in range(3):
        utils.log_dist_once("only once, a", ranks=[0])
        utils.logger.warning_once("only once, b")
    msgs = [r.getMessage() for r in caplog.records if r.name == "zspeed"]
    assert msgs == ["[Rank -1] only once, a", "only once, b"]


def test_set_log_level_from_string():
    old = utils.logger.level
    try:
        utils.set_log_level_from_string("DEBUG")
        assert utils.logger.level == logging.DEBUG
        with pytest.raises(ValueError, match="verbose"):
            utils.set_log_level_from_string("verbose")
    finally:
        utils.logger.setLevel(old)


# -- zero, moe, pipe, checkpoint -------------------------------------------------------------
def test_log_level_config_key_and_deepspeed_utils_logging():
    """The config's log_level (DeepSpeed 0.19.8's key) sets the logger's level at initialize;
    deepspeed.utils.logging is the module holding that logger; unset, the level is kept."""
    from zspeed.runtime.config import ConfigError, get_log_level
    from zspeed.utils import logging as zlogging
    assert zlogging.logger is utils.logger and get_log_level({}) is None
    assert get_log_level({"log_level": "INFO"}) == "INFO"
    saved = utils.logger.level
    try:
        utils.logger.setLevel(logging.DEBUG)
        m = torch.nn.Linear(3, 3)
        c = {"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
        e, *_ = zspeed.initialize(model=m, config=dict(c, log_level="ERROR"))
        assert e.log_level() == "ERROR" and zlogging.get_current_level() == logging.ERROR
        assert zlogging.should_log_le("error") and not zlogging.should_log_le("warning")
        utils.logger.setLevel(logging.WARNING)
        e, *_ = zspeed.initialize(model=torch.nn.Linear(3, 3), config=c)
        assert e.log_level() is None and zlogging.get_current_level() == logging.WARNING
        with pytest.raises(ConfigError, match="log_level"):
            zspeed.initialize(model=torch.nn.Linear(3, 3), config=dict(c, log_level="loud"))
    finally:
        utils.logger.setLevel(saved)


def test_runtime_constants_are_the_schemas_names_and_defaults():
    from zspeed.runtime import constants
    from zspeed.runtime.config import parse_config
    assert constants.GRADIENT_CLIPPING == "gradient_clipping" and constants.GRADIENT_CLIPPING_DEFAULT == 1.0
    assert constants.LOG_LEVEL_DEFAULT is None and constants.ZERO_OPTIMIZATION == "zero_optimization"
    assert constants.STEPS_PER_PRINT_DEFAULT == parse_config({"train_batch_size": 1}).top["steps_per_print"]


def test_required_torch_version(monkeypatch):
    import zspeed.utils.torch as ut
    from zspeed.utils import required_torch_version as rtv
    assert ut.required_torch_version is rtv
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    assert rtv(min_version=2.1) and rtv(min_version="2.5.1") and not rtv(min_version="2.5.2")
    assert rtv(max_version="2.5.1") and not rtv(max_version=2.5) and rtv(min_version=1.8, max_version="2.6")
    monkeypatch.setattr(torch, "__version__", "2.6.0a0+git123")  # a pre-release is below its release
    assert not rtv(min_version="2.6") and rtv(min_version="2.5.9") and rtv(max_version="2.6.0")
    with pytest.raises(ValueError, match="min_version, max_version or both"):
        rtv()
    with pytest.raises(ValueError, match="is not a version"):
        rtv(min_version="latest")


def test_offload_enums_have_deepspeeds_values():
    assert [e.value for e in OffloadDeviceEnum] == ["none", "cpu", "nvme"]
    assert OffloadDeviceEnum.cpu == "cpu"
    assert {e.name for e in OffloadStateTypeEnum} == {"optim_states", "hp_params", "lp_params", "lp_grads",
                                                      "contiguous_grad_buffer"}


def test_zero_init_converts_to_the_configs_dtype_and_restores_constructors():
    with zspeed.zero.Init(config_dict_or_path={"bf16": {"enabled": True}}):
        lin = torch.nn.Linear(2, 2)
    assert lin.weight.dtype == torch.bfloat16
    assert torch.nn.Linear(2, 2).weight.dtype == torch.float32  # constructors are unpatched at exit
    with zspeed.zero.Init(enabled=False):
        assert torch.nn.Linear(2, 2).weight.dtype == torch.float32
    with zspeed.zero.Init():  # no config: DeepSpeed's default dtype, fp16
        assert torch.nn.Linear(2, 2).weight.dtype == torch.float16


def test_gathered_parameters_runs_its_body_on_whole_parameters():
    lin = torch.nn.Linear(3, 2)
    with zspeed.zero.GatheredParameters(lin.weight, modifier_rank=0):
        with torch.no_grad():
            lin.weight.fill_(0.5)
    assert torch.equal(lin.weight, torch.full((2, 3), 0.5))


def test_moe_groups_without_experts_are_returned_as_a_list():
    lin = torch.nn.Linear(3, 2)
    group = {"params": iter(lin.parameters()), "name": "parameters"}
    out = split_params_into_different_moe_groups_for_optimizer(group)
    assert len(out) == 1 and out[0]["params"] == list(lin.parameters()) and out[0]["name"] == "parameters"
    tup = ({"params": [lin.weight]}, {"params": [lin.bias]})
    assert isinstance(split_params_into_different_moe_groups_for_optimizer(tup), list)
    with pytest.raises(ValueError, match="dict"):
        split_params_into_different_moe_groups_for_optimizer([lin.weight][0])
    lin.weight.allreduce = False  # how DeepSpeed's MoE layer marks an expert parameter
    with pytest.raises(MoENotSupported, match="expert"):
        split_params_into_different_moe_groups_for_optimizer([{"params": [lin.weight]}])
    with pytest.raises(MoENotSupported, match="mixture of experts"):
        MoE(hidden_size=4, expert=lin, num_experts=2)


def test_pipe_imports_and_refuses_pipelines():
    spec = LayerSpec(torch.nn.Linear, 4, 3, bias=False)
    layer = spec.build()
    assert isinstance(layer, torch.nn.Linear) and layer.bias is None and layer.weight.shape == (3, 4)
    tied = TiedLayerSpec("emb", torch.nn.Embedding, 5, 2, tied_weight_attr="weight")
    assert tied.key == "emb" and tied.tied_weight_attr == ["weight"]
    with pytest.raises(PipelineNotSupported, match="pipeline parallelism"):
        PipelineModule(layers=[spec], num_stages=2)


def test_clone_tensors_for_torch_save_compacts_views():
    flat = torch.arange(1000, dtype=torch.float32)
    state = {"a": flat[10:17], "nested": [flat[:3], (flat[500:501], 7)], "s": "x"}
    out = clone_tensors_for_torch_save(state)
    assert torch.equal(out["a"], flat[10:17])
    assert out["a"].untyped_storage().nbytes() == 7 * 4
    assert out["nested"][1][1] == 7 and isinstance(out["nested"][1], tuple) and out["s"] == "x"
    out["a"][0] = -1.0
    assert flat[10] == 10.0  # a copy, not a view
    meta = clone_tensors_for_torch_save(flat[:3], device="meta")
    assert meta.device.type == "meta" and meta.shape == (3,)


def test_version_attributes():
    major, minor, patch = (int(x) for x in zspeed.__version__.split("."))
    assert (zspeed.__version_major__, zspeed.__version_minor__, zspeed.__version_patch__) == (major, minor, patch)
    assert zspeed.version == zspeed.__version__
    # None from the sources; a wheel built from a git checkout records its commit and branch
    # (test_cli_polish checks the build step itself)
    if zspeed.__git_hash__ is None:
        assert zspeed.__git_branch__ is None
    else:
        import re
        assert re.fullmatch(r"[0-9a-f]{7,40}", zspeed.__git_hash__) and zspeed.__git_branch__, (
            zspeed.__git_hash__, zspeed.__git_branch__)


def test_set_random_seed_seeds_torch_and_numpy():
    from zspeed.runtime.utils import set_random_seed
    set_random_seed(1234)
    a = (torch.rand(3), np.random.rand(3))
    set_random_seed(1234)
    b = (torch.rand(3), np.random.rand(3))
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1])


# -- DeepSpeed's optimizer classes -----------------------------------------------------------
def _adam_reference(p, grads, lr, betas, eps, wd, adamw, bias_correction):
    """Adam/AdamW in float64 over a list of gradients."""
    p = p.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(grads, 1):
        g = g.double()
        if adamw:
            p = p * (1 - lr * wd)
        else:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        bc1 = 1 - b1 ** t if bias_correction else 1.0
        bc2 = 1 - b2 ** t if bias_correction else 1.0
        p = p - lr * (m / bc1) / ((v / bc2).sqrt() + eps)
    return p


@pytest.mark.parametrize("adam_w_mode", [True, False])
@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_adam_matches_float64_reference(adam_w_mode, bias_correction, dtype):
    from zspeed.ops.adam import FusedAdam
    g = torch.Generator().manual_seed(3)
    p0 = torch.randn(1031, generator=g)
    grads = [torch.randn(1031, generator=g) for _ in range(5)]
    p = torch.nn.Parameter(p0.to(dtype).clone())
    opt = FusedAdam([p], lr=1e-2, bias_correction=bias_correction, betas=(0.8, 0.95), eps=1e-6,
                    adam_w_mode=adam_w_mode, weight_decay=0.1)
    assert opt.adam_w_mode == (1 if adam_w_mode else 0)
    for gr in grads:
        p.grad = gr.to(dtype)
        opt.step()
    ref = _adam_reference(p0.to(dtype).float(), [gr.to(dtype).float() for gr in grads], 1e-2, (0.8, 0.95),
                          1e-6, 0.1, adam_w_mode, bias_correction)
    # fp32: only fp32 rounding of 5 steps; bf16: weights and moments are rounded to bf16
    # (8 bits of mantissa) after every step.
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(p.double(), ref, rtol=tol, atol=tol)
    assert opt.state[p]["exp_avg"].dtype == dtype and float(opt.state[p]["step"]) == 5.0
    assert opt.checkpoint_class == ("AdamW" if adam_w_mode else "Adam")


def test_fused_adam_refuses_what_deepspeeds_refuses():
    from zspeed.ops.adam import FusedAdam
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam([p], amsgrad=True)
    opt = FusedAdam([p])
    p.grad = torch.ones(3)
    with pytest.raises(RuntimeError, match="closure"):
        opt.step(scale=2.0)
    opt.zero_grad()
    assert p.grad is None


def test_fused_lion_matches_float64_reference():
    from zspeed.ops.lion import FusedLion
    g = torch.Generator().manual_seed(5)
    p0 = torch.randn(517, generator=g)
    grads = [torch.randn(517, generator=g) for _ in range(4)]
    p = torch.nn.Parameter(p0.clone())
    opt = FusedLion([p], weight_decay=0.05)
    assert opt.defaults["lr"] == 1e-3 and opt.defaults["betas"] == (0.9, 0.999)  # DeepSpeed's defaults
    ref, m = p0.double(), torch.zeros(517, dtype=torch.float64)
    for gr in grads:
        p.grad = gr
        opt.step()
        gd = gr.double()
        upd = torch.sign(0.9 * m + 0.1 * gd)
        ref = ref * (1 - 1e-3 * 0.05) - 1e-3 * upd
        m = 0.999 * m + 0.001 * gd
    assert torch.allclose(p.double(), ref, rtol=0, atol=1e-6)  # fp32 rounding of 4 steps


def test_deepspeed_cpu_adam_names_and_subgroups():
    from zspeed.ops.adam import CPUAdam, DeepSpeedCPUAdam
    g = torch.Generator().manual_seed(7)
    flat = torch.nn.Parameter(torch.randn(1027, generator=g))
    opt = DeepSpeedCPUAdam([flat], lr=1e-2, weight_decay=0.05)
    assert isinstance(opt, CPUAdam) and opt.adam_w_mode is True and opt.checkpoint_class == "CPUAdam"
    # DeepSpeed's names record the state of the zspeed class they derive from (one layout each)
    from zspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from zspeed.ops.lion import DeepSpeedCPULion
    assert DeepSpeedCPUAdagrad([flat]).checkpoint_class == "CPUAdagrad"
    assert DeepSpeedCPULion([flat]).checkpoint_class == "CPULion"
    history = []
    for sub in (0, 0, 0):
        flat.grad = torch.randn(1027, generator=g)
        before = (flat.detach().clone(), {k: v.clone() if torch.is_tensor(v) else v
                                          for k, v in opt.state.get(sub, {}).items()})
        opt.step_subgroup(sub)
        history.append(before)
    assert opt.state[0]["step"] == 3 and flat not in opt.state
    # Undo the last step with the same gradient: back to the values before it.
    p_before, st_before = history[-1]
    opt.rollback_subgroup(0)
    assert opt.state[0]["step"] == 2
    assert torch.allclose(flat.detach(), p_before, rtol=1e-5, atol=1e-6)
    assert torch.allclose(opt.state[0]["exp_avg"], st_before["exp_avg"], rtol=1e-5, atol=1e-7)
    assert torch.allclose(opt.state[0]["exp_avg_sq"], st_before["exp_avg_sq"], rtol=1e-4, atol=1e-9)
    with pytest.raises(RuntimeError, match="Cannot rollback optimizer state for sub_group_id 5"):
        opt.rollback_subgroup(5)
    opt.rollback_subgroup(0)
    opt.rollback_subgroup(0)
    with pytest.raises(RuntimeError, match="Cannot rollback sub_group_id 0: step count is 0"):
        opt.rollback_subgroup(0)
    other = torch.nn.Parameter(torch.zeros(2))
    other.grad = torch.zeros(2)
    opt.add_param_group({"params": [other]})
    with pytest.raises(ValueError, match="one flat sub-group"):
        opt.step_subgroup(1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rollback_subgroup_of_half_parameters_undoes_the_step(dtype):
    """A bf16/fp16 sub-group: the rollback returns the parameter and the moments to their values
    before the step, up to the roundings in their dtypes (computed in float64): the step's rounding
    and the rollback's make a few units of the last place of each tensor's dtype (fp32 moments: the
    parameter's error is its own dtype's). bf16 states are refused: subtracting the gradient's share
    from moments rounded to bf16 leaves errors as large as the moments."""
    from zspeed.ops.adam import DeepSpeedCPUAdam
    g = torch.Generator().manual_seed(11)
    p = torch.nn.Parameter(torch.randn(1031, generator=g).to(dtype))
    opt = DeepSpeedCPUAdam([p], lr=1e-3, weight_decay=0.01)
    p.grad = torch.randn(1031, generator=g).to(dtype)
    opt.step_subgroup(0)  # (lr 1e-3 below)
    p.grad = torch.randn(1031, generator=g).to(dtype)
    before = (p.detach().double(), opt.state[0]["exp_avg"].double(), opt.state[0]["exp_avg_sq"].double())
    opt.step_subgroup(0)
    assert not torch.equal(p.detach().double(), before[0])
    opt.rollback_subgroup(0)
    assert opt.state[0]["step"] == 1
    ulp, st_ulp = torch.finfo(dtype).eps, torch.finfo(torch.float32).eps
    assert torch.allclose(p.detach().double(), before[0], rtol=4 * ulp, atol=0)
    assert torch.allclose(opt.state[0]["exp_avg"].double(), before[1], rtol=8 * st_ulp, atol=1e-6)
    assert torch.allclose(opt.state[0]["exp_avg_sq"].double(), before[2], rtol=8 * st_ulp, atol=1e-6)
    narrow = DeepSpeedCPUAdam([p], lr=1e-3, fp32_optimizer_states=False)
    narrow.step_subgroup(0)
    if narrow.state[0]["exp_avg"].dtype != torch.float32:  # (bf16 moments for bf16 and fp16 parameters)
        with pytest.raises(TypeError, match="a rollback needs fp32 states"):
            narrow.rollback_subgroup(0)
        assert narrow.state[0]["step"] == 1


def test_deepspeed_cpu_lion_defaults_and_state_dtype():
    from zspeed.ops.lion import CPULion, DeepSpeedCPULion
    p = torch.nn.Parameter(torch.randn(33).bfloat16())
    p.grad = torch.randn(33).bfloat16()
    opt = DeepSpeedCPULion([p], fp32_optimizer_states=False)
    assert isinstance(opt, CPULion) and opt.defaults["lr"] == 1e-3 and opt.defaults["betas"] == (0.9, 0.999)
    opt.step()
    assert opt.state[p]["exp_avg"].dtype == torch.bfloat16
    q = torch.nn.Parameter(torch.randn(33).bfloat16())
    q.grad = torch.randn(33).bfloat16()
    DeepSpeedCPULion([q]).step()


@pytest.mark.parametrize("fp32_states", [True, False])
def test_deepspeed_cpu_adagrad_matches_float64_reference(fp32_states):
    """DeepSpeed's signature (lr 1e-2, eps 1e-10) on odd sizes against a float64 Adagrad; fp32
    sums are within 1e-6 relative (fp32 arithmetic), bf16 parameters within their rounding."""
    from zspeed.ops.adagrad import CPUAdagrad, DeepSpeedCPUAdagrad
    g = torch.Generator().manual_seed(5)
    w0 = torch.randn(1027, generator=g)
    grads = [torch.randn(1027, generator=g) for _ in range(3)]
    p = torch.nn.Parameter(w0.clone())
    opt = DeepSpeedCPUAdagrad([p], weight_decay=0.01, fp32_optimizer_states=fp32_states)
    assert isinstance(opt, CPUAdagrad) and opt.defaults["lr"] == 1e-2 and opt.defaults["eps"] == 1e-10
    w, acc = w0.double(), torch.zeros(1027, dtype=torch.float64)
    for gr in grads:
        p.grad = gr.clone()
        opt.step()
        d = gr.double() + 0.01 * w
        acc += d * d
        w = w - 1e-2 * d / (acc.sqrt() + 1e-10)
    assert opt.state[p]["sum"].dtype == torch.float32  # fp32 parameters keep an fp32 sum either way
    assert torch.allclose(p.detach().double(), w, rtol=1e-6, atol=1e-7)
    b = torch.nn.Parameter(torch.randn(37).bfloat16())
    b.grad = torch.randn(37).bfloat16()
    narrow = DeepSpeedCPUAdagrad([b], fp32_optimizer_states=fp32_states)
    narrow.step()
    assert narrow.state[b]["sum"].dtype == (torch.float32 if fp32_states else torch.bfloat16)
    with pytest.raises(ValueError, match="amsgrad"):
        DeepSpeedCPUAdagrad([p], amsgrad=True)


@pytest.mark.parametrize("name,cls", [("Adam", "DeepSpeedCPUAdam"), ("AdamW", "DeepSpeedCPUAdam"),
                                      ("Lion", "DeepSpeedCPULion"), ("Adagrad", "DeepSpeedCPUAdagrad")])
def test_offloaded_engine_optimizer_is_deepspeeds_cpu_class(name, cls, monkeypatch):
    """With offload_optimizer cpu, engine.optimizer.optimizer is an instance of DeepSpeed's CPU
    class for the configured optimizer (DeepSpeed's tests check isinstance)."""
    from zspeed.ops import _ds_optim
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")
    c = {"train_batch_size": 2, "optimizer": {"type": name, "params": {"lr": 1e-3}},
         "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    e, *_ = zspeed.initialize(model=torch.nn.Linear(5, 3), config=c)
    assert isinstance(e.optimizer.optimizer, getattr(_ds_optim, cls))
    if name == "AdamW":
        assert e.optimizer.optimizer.adam_w_mode is True
    e.close()


@pytest.mark.parametrize("name,offload,torch_adam,adam_w_mode,expect", [
    ("AdamW", False, False, False, ("FusedAdam", True)), ("AdamW", False, True, False, ("AdamW", None)),
    ("AdamW", True, False, False, ("DeepSpeedCPUAdam", True)), ("AdamW", True, True, True, ("AdamW", None)),
    ("Adam", False, False, False, ("FusedAdam", False)), ("Adam", False, True, False, ("Adam", None)),
    ("Adam", True, False, False, ("DeepSpeedCPUAdam", False)), ("Adam", False, False, True, ("FusedAdam", True)),
    ("Adam", False, True, True, ("AdamW", None)), ("Lion", False, False, None, ("FusedLion", None)),
    ("Lion", True, False, None, ("DeepSpeedCPULion", None))])
def test_the_engines_basic_optimizer_has_deepspeeds_class(name, offload, torch_adam, adam_w_mode, expect,
                                                         monkeypatch):
    """engine.optimizer.optimizer is an instance of the class DeepSpeed's engine builds for the
    config (DeepSpeed's tests/unit/ops/adam/test_adamw.py table; torch's fused Adam/AdamW stands
    in for FusedAdam), with DeepSpeed's adam_w_mode (AdamW is always decoupled)."""
    from zspeed.ops import _ds_optim
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")
    params = {"lr": 1.5e-4}
    if name != "Lion":
        params.update(torch_adam=torch_adam, adam_w_mode=adam_w_mode)
    c = {"train_batch_size": 2, "optimizer": {"type": name, "params": params}, "gradient_clipping": 1.0,
         "zero_optimization": {"stage": 2, "cpu_offload": offload}}
    e, *_ = zspeed.initialize(model=torch.nn.Linear(5, 3), config=c)
    cls_name, mode = expect
    cls = getattr(torch.optim, cls_name, None) or getattr(_ds_optim, cls_name)
    basic = e.optimizer.optimizer
    assert isinstance(basic, cls), type(basic)
    if cls_name == "FusedAdam":
        assert not isinstance(basic, _ds_optim.FusedLion) and isinstance(basic, torch.optim.Optimizer)
    if mode is not None:
        assert basic.adam_w_mode == mode
    e.close()


def test_op_builders_report_and_load_the_prebuilt_ops(monkeypatch):
    import zspeed.ops as ops
    from zspeed.ops import op_builder as ob
    compat = ops.__compatible_ops__
    ours = {"async_io", "cpu_adam", "cpu_adagrad", "cpu_lion", "fused_adam", "fused_lion"}
    assert {k for k, v in compat.items() if v} == ours
    # DeepSpeed's other builders exist (scripts import them to check) and say they cannot run
    assert compat["fused_lamb"] is False and compat["transformer_inference"] is False and len(compat) == 24
    assert ob.FusedLambBuilder.NAME == "fused_lamb" and ob.FusedLambBuilder.BUILD_VAR == "DS_BUILD_FUSED_LAMB"
    with pytest.raises(RuntimeError, match="'fused_lamb' .FusedLambBuilder. does not exist in zspeed"):
        ob.FusedLambBuilder().load()
    from zspeed import git_version_info as gvi
    assert gvi.version == zspeed.__version__ and gvi.git_hash == (zspeed.__git_hash__ or "[none]")
    assert gvi.compatible_ops == compat and gvi.installed_ops == compat
    assert gvi.torch_info["version"] == ".".join(torch.__version__.split(".")[:2])
    assert set(gvi.torch_info) == {"version", "bf16_support", "cuda_version", "nccl_version", "hip_version"}
    assert gvi.accelerator_name in ("cpu", "cuda")
    assert ob.CPULionBuilder().load().DeepSpeedCPULion is not None
    assert ob.AsyncIOBuilder().absolute_name() == "zspeed.ops.aio"
    with pytest.raises(NotImplementedError, match="prebuilt"):
        ob.CPUAdamBuilder().builder()
    # without libzspeed: the native ops say so, the torch ones still work, load() names the reason
    from zspeed import _native
    def missing():
        raise zspeed.ZSpeedError("libzspeed not found (test)")
    monkeypatch.setattr(_native, "load", missing)
    compat = ops.__compatible_ops__
    assert compat["async_io"] is False and compat["cpu_adam"] is False and compat["fused_adam"] is True
    with pytest.raises(zspeed.ZSpeedError, match="libzspeed not found"):
        ob.AsyncIOBuilder().load()


def test_async_pwrite_fd_keyword(tmp_path):
    from zspeed.ops.aio import AsyncIOHandle
    h = AsyncIOHandle(backend="threads")
    x = torch.arange(100, dtype=torch.float32)
    fd = os.open(str(tmp_path / "fd.bin"), os.O_RDWR | os.O_CREAT)
    try:
        assert h.async_pwrite(x, fd=fd) == 0 and h.wait() == 1
        with pytest.raises(TypeError, match="not both"):
            h.async_pwrite(x, str(tmp_path / "other.bin"), fd=fd)
        with pytest.raises(TypeError, match="int"):
            h.async_pwrite(x, fd="3")
    finally:
        os.close(fd)
        h.close()
    back = np.fromfile(tmp_path / "fd.bin", dtype=np.float32)
    assert np.array_equal(back, x.numpy())


def test_deepspeed_config_error_is_the_config_error():
    """deepspeed.DeepSpeedConfigError (what DeepSpeed's scripts and tests catch) is zspeed's
    ConfigError, raised for an invalid config such as an unknown tag_validation mode."""
    import zspeed
    from zspeed.runtime.config import ConfigError, parse_config
    assert zspeed.DeepSpeedConfigError is ConfigError and "DeepSpeedConfigError" in zspeed.__all__
    with pytest.raises(zspeed.DeepSpeedConfigError, match="tag_validation"):
        parse_config({"train_batch_size": 2, "checkpoint": {"tag_validation": "foo"}}, world_size=1)


def test_see_memory_usage_prints_only_when_forced(capsys):
    from zspeed.runtime.utils import see_memory_usage
    see_memory_usage("quiet")
    assert capsys.readouterr().out == ""
    see_memory_usage("after the forward", force=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "after the forward" and out[1].startswith("MA ") and "Max_CA" in out[1]
    assert out[2].startswith("CPU Virtual Memory")


def test_deepspeeds_schedule_parameter_and_optimizer_names():
    from zspeed.runtime import config, lr_schedules as lrs
    assert lrs.LR_SCHEDULE == "lr_schedule" and lrs.WARMUP_NUM_STEPS == "warmup_num_steps"
    assert lrs.LR_RANGE_TEST_MIN_LR == "lr_range_test_min_lr" and lrs.COS_MIN_RATIO == "cos_min_ratio"
    # each name is a parameter the schedule of that family accepts
    s = lrs.build_scheduler("WarmupLR", {lrs.WARMUP_MIN_LR: 0.0, lrs.WARMUP_NUM_STEPS: 3},
                            torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    assert s.get_lr() == [0.0]
    assert config.ADAM_OPTIMIZER == "adam" and config.LION_OPTIMIZER == "lion" and len(config.DEEPSPEED_OPTIMIZERS) == 12


def test_runtime_zero_reexports_unwrap_and_the_cpu_device_count_reads_local_size(monkeypatch):
    from zspeed.runtime import zero
    from zspeed.runtime.zero import stage3
    assert zero.unwrap_model_for_generation is stage3.unwrap_model_for_generation
    net = torch.nn.Linear(3, 2)
    with zero.unwrap_model_for_generation(net) as m:  # below stage 3: the model itself
        assert m is net
    from zspeed.accelerator import CPUAccelerator
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("LOCAL_SIZE", "4")  # DeepSpeed's CPU accelerator counts these
    assert CPUAccelerator().device_count() == 4
    monkeypatch.setenv("LOCAL_SIZE", "0")
    assert CPUAccelerator().device_count() == 1
