"""zero.Init's config and dtype arguments: read by the engine's own parser (same files, same
messages), with only the fp16/bf16 sections required."""
import json
import os

import pytest

torch = pytest.importorskip("torch")

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError, parse_config  # noqa: E402


def dtype_of(**kw):
    return zspeed.zero.Init(**kw).dtype


def refused(*needles, **kw):
    with pytest.raises(ConfigError) as ei:
        zspeed.zero.Init(**kw)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


def test_the_training_dtype_comes_from_the_precision_sections_without_batch_sizes():
    zero = {"zero_optimization": {"stage": 3}}
    assert dtype_of(config_dict_or_path={"bf16": {"enabled": True}, **zero}) == torch.bfloat16
    assert dtype_of(config={"bfloat16": {"enabled": True}}) == torch.bfloat16
    assert dtype_of(config_dict_or_path={"fp16": {"enabled": True, "loss_scale": 0}}) == torch.float16
    assert dtype_of(config_dict_or_path=zero) == torch.float32
    assert dtype_of() == torch.float16  # DeepSpeed's default without a config
    engine_cfg = parse_config({"train_batch_size": 2, "bf16": {"enabled": True}}, world_size=1)
    assert dtype_of(config_dict_or_path=engine_cfg) == torch.bfloat16


def test_a_section_given_as_true_is_a_config_error_saying_what_to_write():
    refused("config section 'bf16' must be an object", 'Write "bf16": {"enabled": true}',
            config_dict_or_path={"bf16": True})


def test_precision_keys_are_checked_as_the_engine_checks_them():
    refused("unknown config key 'enabeld' in section 'bf16'", "Did you mean 'enabled'?",
            config_dict_or_path={"bf16": {"enabeld": True}})
    refused("fp16.enabled and bf16.enabled are both true",
            config_dict_or_path={"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    refused("'fp16.enabled' = 'yes' has the wrong type", config_dict_or_path={"fp16": {"enabled": "yes"}})


def test_a_missing_file_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "missing.json"
    refused("cannot read the DeepSpeed config file", str(path), "Check the path", config_dict_or_path=str(path))


def test_a_file_with_a_duplicate_key_is_refused(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"bf16": {"enabled": true}, "bf16": {"enabled": false}}')
    refused("the key 'bf16' appears twice", str(path), config_dict_or_path=path)


def test_an_hjson_file_the_engine_reads_gives_the_same_dtype(tmp_path):
    pytest.importorskip("hjson", reason="hjson files are read when the hjson package is installed")
    path = tmp_path / "ds.hjson"
    path.write_text("{\n  // DeepSpeed reads config files as hjson\n  train_batch_size: 2\n"
                    "  bf16: {enabled: true}\n}\n")
    assert parse_config(str(path), world_size=1).bf16_enabled
    assert dtype_of(config_dict_or_path=str(path)) == torch.bfloat16


def test_a_file_gives_the_dtype_and_the_sanity_checks_from_one_reading(tmp_path, monkeypatch):
    """A config path is read once for both (the file could change between two readings)."""
    import zspeed.runtime.config as config_mod
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": True},
                                "zero_optimization": {"stage": 3, "enable_sanity_checks": True}}))
    reads = []
    real = config_mod.load_json_config
    monkeypatch.setattr(config_mod, "load_json_config", lambda p: reads.append(p) or real(p))
    init = zspeed.zero.Init(config_dict_or_path=str(path))
    assert init.dtype == torch.bfloat16 and init._sanity is True
    assert len(reads) == 1
    assert zspeed.zero.Init(config_dict_or_path={"zero_optimization": {"stage": 3}})._sanity is False


@pytest.mark.parametrize("dtype", [torch.int8, torch.float64, torch.complex64, "bf16"], ids=str)
def test_dtype_must_be_a_training_float(dtype):
    refused(f"zero.Init(dtype={dtype!r})", "torch.float32, torch.float16 or torch.bfloat16", dtype=dtype)


def test_a_config_of_another_type_is_refused():
    refused("got list", config_dict_or_path=[json.dumps({"bf16": {"enabled": True}})])


# -- where zero.Init builds: the GPU when there is one (as DeepSpeed's Init), else the CPU ---------
class _Built(torch.nn.Module):
    def __init__(self, parent_init=True):
        super().__init__()
        self.a = torch.nn.Linear(37, 29)
        self.b = torch.nn.Embedding(41, 29)
        self.big = torch.nn.Linear(300, 301, bias=False)  # large enough for a fill on the build device
        self.register_buffer("pos", torch.arange(29, dtype=torch.float32))
        if parent_init:
            self.apply(self._init)  # a parent's initialisation after its children are built

    @staticmethod
    def _init(m):
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)


def test_a_bad_init_device_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("ZSPEED_INIT_DEVICE", "tpu")
    with pytest.raises(ConfigError, match="ZSPEED_INIT_DEVICE='tpu'.*cpu.*cuda"):
        with zspeed.zero.Init(dtype=torch.bfloat16):
            pass


@pytest.mark.parametrize("where", ["default", "cpu"])
def test_zero_init_builds_where_torch_would_on_that_device_and_keeps_the_weights_in_host_memory(
        monkeypatch, where):
    """One rank: every parameter ends in host memory in the training dtype, its values those of
    building on the build device with the same seed and rounding (the GPU's generator when there
    is one, ZSPEED_INIT_DEVICE=cpu: the CPU's), also for a random fill of a parameter already in
    host memory (which runs on the build device); buffers stay where they were created (the
    build device), as with DeepSpeed's Init."""
    if where == "cpu":
        monkeypatch.setenv("ZSPEED_INIT_DEVICE", "cpu")
    else:
        monkeypatch.delenv("ZSPEED_INIT_DEVICE", raising=False)
    build = "cuda" if where == "default" and torch.cuda.is_available() and \
        os.environ.get("ZSPEED_DEVICE", "cuda").startswith("cuda") else "cpu"
    torch.manual_seed(0)
    with zspeed.zero.Init(dtype=torch.bfloat16):
        m = _Built()
        assert m.big.weight.device.type == "cpu"
        torch.nn.init.normal_(m.big.weight, std=0.5)  # a scaled init after construction, in host memory
    torch.manual_seed(0)
    with torch.device(build):  # the same on the build device: children in bf16 when built,
        ref = _Built(parent_init=False).to(torch.bfloat16)  # then the parent's init over them
        with torch.no_grad():
            ref.apply(_Built._init)
            torch.nn.init.normal_(ref.big.weight, std=0.5)
    for (name, p), (_, r) in zip(m.named_parameters(), ref.named_parameters()):
        assert p.device.type == "cpu" and p.dtype == torch.bfloat16, name
        assert torch.equal(p, r.detach().cpu()), name
    assert m.pos.device.type == build and m.pos.dtype == torch.float32


def test_random_fills_of_large_host_tensors_are_moved_to_the_build_device():
    """The mode zero.Init pushes with a build device (here the CPU stands in for the GPU, so the
    values can be compared with fills where they are): torch.nn.init's functions (their tensor
    passed as tensor=) and the tensors' in-place random methods on a large host tensor run on the
    device and are copied back; small tensors and fills with their own generator stay."""
    from zspeed.runtime.zero import _FillsOnDevice
    big = torch.nn.Parameter(torch.zeros(300, 301, dtype=torch.bfloat16))
    small = torch.zeros(7, 5)
    mode = _FillsOnDevice(torch.device("cpu"))
    torch.manual_seed(3)
    with mode:
        torch.nn.init.normal_(big, std=0.5)
        a = big.detach().clone()
        torch.nn.init.kaiming_uniform_(big)
        b = big.detach().clone()
        big.data.uniform_(-1, 1)
        c = big.detach().clone()
        torch.nn.init.normal_(small)
        torch.nn.init.normal_(big, generator=torch.Generator().manual_seed(1))
    assert mode.moved == 3
    torch.manual_seed(3)
    ref = torch.zeros(300, 301, dtype=torch.bfloat16)
    for want, fill in ((a, lambda t: torch.nn.init.normal_(t, std=0.5)), (b, torch.nn.init.kaiming_uniform_),
                       (c, lambda t: t.uniform_(-1, 1))):
        fill(ref)
        assert torch.equal(want, ref)


def test_zero_init_refuses_a_one_rank_group_under_a_many_rank_launcher(monkeypatch):
    """A one-process group where the launcher's WORLD_SIZE says several (a library created the
    group first): zero.Init would keep every parameter whole on every rank; it says so instead
    (DeepSpeed's check). WORLD_SIZE 1, unset or not a number: no complaint."""
    import torch.distributed as td
    import zspeed
    from zspeed.runtime.zero.partition_parameters import _contradicting_single_rank_pg_error as check
    assert "WORLD_SIZE=8" in check(1, None, {"WORLD_SIZE": "8"})
    assert "init_distributed" in check(1, None, {"WORLD_SIZE": "8"})
    for env in ({"WORLD_SIZE": "1"}, {}, {"WORLD_SIZE": ""}, {"WORLD_SIZE": "eight"}, {"WORLD_SIZE": None}):
        assert check(1, None, env) is None
    assert check(8, None, {"WORLD_SIZE": "8"}) is None and check(1, object(), {"WORLD_SIZE": "8"}) is None
    zspeed.comm.init_distributed(verbose=False)  # this process's one-rank group
    assert td.get_world_size() == 1
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(RuntimeError, match="WORLD_SIZE=4"):
        with zspeed.zero.Init():
            torch.nn.Linear(3, 3)
    assert not getattr(torch.nn.Linear.__init__, "_zspeed_wrapped", False)
    assert not hasattr(torch.nn.Linear(2, 2).weight, "ds_id")


def test_one_rank_keeps_parameters_whole_with_deepspeeds_marks():
    """One rank: zero.Init keeps each parameter whole (docs/COMPAT.md) but marks it as DeepSpeed's
    does (ds_id, which scripts and DeepSpeed's tests read as "zero.Init processed it"; ds_status
    AVAILABLE, as it is whole), also in nested contexts; a new id per parameter, kept by an engine."""
    from zspeed.runtime.zero import ZeroParamStatus
    with zspeed.zero.Init(dtype=torch.bfloat16):
        with zspeed.zero.Init(dtype=torch.bfloat16):
            m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    ps = list(m.parameters())
    assert all(p.numel() > 0 and not hasattr(p, "ds_tensor") for p in ps)
    assert all(p.ds_status == ZeroParamStatus.AVAILABLE and p.ds_persist is False for p in ps)
    ids = [p.ds_id for p in ps]
    assert len(set(ids)) == len(ids)
    e, *_ = zspeed.initialize(model=m, config={"train_batch_size": 1, "bf16": {"enabled": True},
                                               "zero_optimization": {"stage": 3}})
    assert [p.ds_id for p in e.module.parameters()] == ids
