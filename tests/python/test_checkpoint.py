"""Checkpoints: round trip, bit-exact resume, layout, tags and `latest`, integrity (manifest
checksums), all-or-nothing loads that name the file and field, client_state, state dtype
conversion, full disks, symlinks in shared folders, and to-fp32.

The kill -9 tests are in test_checkpoint_crash.py."""
import errno
import json
import os
import sys
import zlib

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch (pip install torch)")
pytest.importorskip("safetensors", reason="zspeed checkpoints need safetensors (pip install torch)")

import zspeed

# These tests compare against CPU references: keep the engine on the CPU on GPU machines too.
import zspeed.runtime.checkpoint_files as cf
from zspeed.runtime.checkpoint import CheckpointError
from zspeed.runtime.checkpoint_fp32 import main_to_fp32
from engine_helpers import TinyLM, lm_loss, native_ops_available, token_data as data, train
from checkpoint_helpers import edit_meta, leftovers, rewrite, same, snapshot, whole_masters


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """CPU-only by design (the checkpoint files are compared with CPU-built references): ZSPEED_DEVICE=cpu for each test, also under
    tests/gpu/gate.py (set per test, so that other files' tests keep the GPU)."""
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")


CONFIGS = {
    "fp32": {},
    "bf16_offload": {"bf16": {"enabled": True},
                     "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    "fp16_offload_native": {"fp16": {"enabled": True, "initial_scale_power": 10},
                            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "state_dtype": "bf16"}},
                            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    "fp16_sched_clip": {"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 3},
                        "gradient_clipping": 0.3, "zero_optimization": {"stage": 1},
                        "scheduler": {"type": "WarmupCosineLR",
                                      "params": {"total_num_steps": 30, "warmup_num_steps": 5}}},
}


def make(kind, gas=1):
    c = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}}}
    c.update(json.loads(json.dumps(CONFIGS[kind])))
    if kind == "bf16_offload":
        c["optimizer"]["params"]["torch_adam"] = True
    e, *_ = zspeed.initialize(model=TinyLM(), config=c)
    return e


# -- round trips ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_bit_exact_resume(kind, tmp_path):
    if "native" in kind and not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")
    batches = data(24)
    a = make(kind, gas=2)
    train(a, batches[:10], loss=lm_loss)
    saved_scale = a.loss_scale
    assert a.save_checkpoint(tmp_path, client_state={"epoch": 2, "ids": batches[0], "nested": [1, {"x": 0.5}]})
    train(a, batches[10:], loss=lm_loss)
    b = make(kind, gas=2)
    path, client = b.load_checkpoint(tmp_path)
    assert path == str(tmp_path / "global_step5")
    assert client["epoch"] == 2 and torch.equal(client["ids"], batches[0]) and client["nested"] == [1, {"x": 0.5}]
    assert (b.global_steps, b.micro_steps, b.loss_scale) == (5, 10, saved_scale)
    train(b, batches[10:], loss=lm_loss)
    for (n, x), y in zip(a.module.state_dict().items(), b.module.state_dict().values()):
        assert torch.equal(x, y), n  # bit-exact: every tensor identical after the resumed run
    assert a.get_lr() == b.get_lr() and a.loss_scale == b.loss_scale and a.skipped_steps == b.skipped_steps
    ma, mb = a._master_named(), b._master_named()
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_layout_latest_and_tags(tmp_path):
    e = make("fp32")
    train(e, data(3), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="first")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path)
    assert (tmp_path / "latest").read_text() == "global_step4"
    files = sorted(os.listdir(tmp_path / "first"))
    assert files == ["manifest.json", "master.safetensors", "meta.json", "model.safetensors", "optim.safetensors"]
    manifest = json.loads((tmp_path / "first" / "manifest.json").read_text())
    assert sorted(manifest["files"]) == [f for f in files if f != "manifest.json"]
    for name, entry in manifest["files"].items():
        raw = (tmp_path / "first" / name).read_bytes()
        assert entry == {"bytes": len(raw), "crc32": f"{zlib.crc32(raw):08x}"}
    assert leftovers(tmp_path) == []  # no staging folders or temporary files left behind
    f = make("fp32")
    assert f.load_checkpoint(tmp_path, tag="first")[0].endswith("first") and f.global_steps == 3
    assert f.load_checkpoint(tmp_path)[0].endswith("global_step4") and f.global_steps == 4
    e.save_checkpoint(tmp_path, tag="nolatest", save_latest=False)
    assert (tmp_path / "latest").read_text() == "global_step4"
    # The files are plain safetensors (the tied out.weight is stored once, as emb.weight).
    from safetensors.torch import load_file
    model = load_file(str(tmp_path / "first" / "model.safetensors"))
    assert sorted(model) == ["calls", "emb.weight", "mid.bias", "mid.weight"]


def test_missing_checkpoint_returns_none(tmp_path):
    e = make("fp32")
    assert e.load_checkpoint(tmp_path / "nothing") == (None, None)
    assert e.load_checkpoint(tmp_path, tag="absent") == (None, None)
    assert e.load_checkpoint(tmp_path) == (None, None)  # a folder without 'latest'


def test_resaving_a_tag_replaces_it_whole(tmp_path):
    e = make("fp32")
    train(e, data(2), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="best", client_state={"t": torch.ones(3)})
    train(e, data(2), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="best")  # no client tensors this time: client.safetensors goes away
    assert "client.safetensors" not in os.listdir(tmp_path / "best") and leftovers(tmp_path) == []
    f = make("fp32")
    assert f.load_checkpoint(tmp_path)[1] == {} and f.global_steps == 4
    # A folder of that name that is not a checkpoint is never replaced.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(CheckpointError, match="not a zspeed checkpoint"):
        e.save_checkpoint(tmp_path, tag="mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep" and leftovers(tmp_path) == []


# -- tags and latest (items 5 and 9) ----------------------------------------------------------------
@pytest.mark.parametrize("tag,why", [("step1 ", "whitespace"), (" step1", "whitespace"), ("a\x00b", "NUL"),
                                     ("x" * 201, "201 bytes"), ("../evil", "separator"), ("a/b", "separator"),
                                     ("a\\b", "separator"), (".hidden", "starts with '.'"), ("", "empty"),
                                     ("latest", "latest"), ("a:b", "Windows"), ("a\nb", "control")])
def test_bad_tags_are_refused_before_anything_is_written(tmp_path, tag, why):
    e = make("fp32")
    with pytest.raises(CheckpointError, match=why):
        e.save_checkpoint(tmp_path / "ck", tag=tag)
    assert not (tmp_path / "ck").exists()
    with pytest.raises(CheckpointError, match=why):
        e.load_checkpoint(tmp_path, tag=tag)
    e.save_checkpoint(tmp_path / "ck", tag=42)  # DeepSpeed accepts any tag it can str()
    assert (tmp_path / "ck" / "latest").read_text() == "42"


def test_latest_is_validated(tmp_path):
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="step1")
    latest = tmp_path / "latest"
    for content, why in [(b"step1 ", "whitespace"), (b" step1", "whitespace"), (b"../step1", "separator"),
                         (str(tmp_path / "step1").encode(), "separator"), (b"gone", "not a checkpoint folder"),
                         (b"\xff\xfe\x00", "not UTF-8"), (b"", "empty"), (b"x" * 5000, "larger than")]:
        latest.write_bytes(content)
        f = make("fp32")
        before = snapshot(f)
        with pytest.raises(CheckpointError, match=why):
            f.load_checkpoint(tmp_path)
        assert same(before, snapshot(f))
    latest.write_bytes(b"step1\n")  # a newline at the end is fine (echo step1 > latest)
    assert make("fp32").load_checkpoint(tmp_path)[0].endswith("step1")


# -- integrity (item 7) ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["model.safetensors", "master.safetensors", "optim.safetensors", "meta.json",
                                  "client.safetensors"])
def test_a_flipped_byte_is_detected(tmp_path, name):
    e = make("fp32")
    train(e, data(2), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="t", client_state={"x": torch.arange(50.0)})
    p = tmp_path / "t" / name
    raw = bytearray(p.read_bytes())
    raw[len(raw) * 2 // 3] ^= 0x10  # in the tensor data (or JSON text), not the header
    p.write_bytes(bytes(raw))
    f = make("fp32")
    before = snapshot(f)
    with pytest.raises(CheckpointError, match=rf"{name}' is corrupt: its CRC-32"):
        f.load_checkpoint(tmp_path)
    assert same(before, snapshot(f))
    p.write_bytes(bytes(raw[:-7]))
    with pytest.raises(CheckpointError, match="truncated"):
        f.load_checkpoint(tmp_path)
    p.unlink()
    with pytest.raises(CheckpointError, match=f"incomplete: {name}, listed in its manifest, is missing"):
        f.load_checkpoint(tmp_path)
    assert same(before, snapshot(f))


def test_manifest_problems(tmp_path):
    e = make("fp32")
    e.save_checkpoint(tmp_path, tag="a")
    e.save_checkpoint(tmp_path, tag="b")
    # A file of another save (a copy gone wrong) differs from the manifest.
    os.replace(tmp_path / "b" / "optim.safetensors", tmp_path / "a" / "optim.safetensors")
    train(e, data(1), loss=lm_loss)
    with pytest.raises(CheckpointError, match="optim.safetensors"):
        make("fp32").load_checkpoint(tmp_path, tag="a")
    m = tmp_path / "b" / "manifest.json"
    m.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        make("fp32").load_checkpoint(tmp_path, tag="b")
    m.write_text(json.dumps({"format": "zspeed-checkpoint-2", "files": {"../../x": {"bytes": 1, "crc32": "0"}}}))
    with pytest.raises(CheckpointError, match="malformed"):
        make("fp32").load_checkpoint(tmp_path, tag="b")
    m.unlink()
    with pytest.raises(CheckpointError, match="no manifest.json: it holds meta.json without a manifest"):
        make("fp32").load_checkpoint(tmp_path, tag="b")
    # A DeepSpeed checkpoint (its pickled files in a tag folder): the error says how to bring its weights over.
    ds = tmp_path / "ds" / "global_step1"
    ds.mkdir(parents=True)
    (tmp_path / "ds" / "latest").write_text("global_step1")
    torch.save({"module": {}}, ds / "mp_rank_00_model_states.pt")
    e = make("fp32")
    before = {k: v.clone() for k, v in e.module.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"DeepSpeed's checkpoint files \(mp_rank_00_model_states.pt\).*"
                                              r"zero_to_fp32.py.*load_state_dict"):
        e.load_checkpoint(tmp_path / "ds")
    assert all(torch.equal(v, e.module.state_dict()[k]) for k, v in before.items())  # nothing loaded


# -- all-or-nothing loads that name the problem (item 4) --------------------------------------------
def test_load_validation_names_the_problem(tmp_path):
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="t")

    class Wider(TinyLM):
        def __init__(self):
            super().__init__()
            self.mid = torch.nn.Linear(11, 11)
            self.extra = torch.nn.Linear(2, 2)

    class Other(TinyLM):
        def __init__(self):
            super().__init__(vocab=29)

    cfg = {"train_batch_size": 4, "optimizer": {"type": "AdamW"}}
    o, *_ = zspeed.initialize(model=Other(), config=cfg)
    with pytest.raises(CheckpointError, match=r"shape mismatch: emb.weight: checkpoint \(23, 11\) vs model \(29, 11\)"):
        o.load_checkpoint(tmp_path, tag="t")
    w, *_ = zspeed.initialize(model=Wider(), config=cfg)
    before = snapshot(w)
    with pytest.raises(CheckpointError, match="missing 2: extra.weight, extra.bias"):
        w.load_checkpoint(tmp_path, tag="t")
    assert same(before, snapshot(w))  # a failed load changed nothing
    # weights only, non-strict: loads what matches
    w.load_checkpoint(tmp_path, tag="t", load_module_strict=False, load_optimizer_states=False)
    # the step counters come back without the optimizer states, as DeepSpeed restores them
    assert torch.equal(w.module.mid.weight, e.module.mid.weight) and w.global_steps == e.global_steps == 1


def test_counters_come_back_unless_module_only(tmp_path):
    """DeepSpeed's load_checkpoint restores global_steps, global_samples and skipped_steps with
    load_optimizer_states=False too; only load_module_only=True leaves them."""
    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW"},
           "fp16": {"enabled": True, "initial_scale_power": 32}}  # 2**32: the first steps overflow

    def fp16():
        return zspeed.initialize(model=TinyLM(), config=cfg)[0]
    e = fp16()
    train(e, data(4), loss=lm_loss)
    counters = (e.global_steps, e.global_samples, e.micro_steps, e.skipped_steps)
    assert counters[0] == 4 and counters[3] > 0, counters
    e.save_checkpoint(tmp_path, tag="t")
    w = fp16()
    w.load_checkpoint(tmp_path, tag="t", load_optimizer_states=False)
    assert (w.global_steps, w.global_samples, w.micro_steps, w.skipped_steps) == counters
    assert not any(w.optimizer.state.values())  # the optimizer states were not loaded
    m = fp16()
    m.load_checkpoint(tmp_path, tag="t", load_module_only=True)
    assert (m.global_steps, m.global_samples, m.micro_steps, m.skipped_steps) == (0, 0, 0, 0)
    assert torch.equal(m.module.mid.weight, e.module.mid.weight)


def test_optimizer_mismatch_changes_nothing(tmp_path):
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    with pytest.raises(CheckpointError, match="client_state value at 'client_state.f' has type"):
        e.save_checkpoint(tmp_path, client_state={"f": object()})
    assert not (tmp_path / "latest").exists() and leftovers(tmp_path) == []
    e.save_checkpoint(tmp_path, tag="t")
    lion, *_ = zspeed.initialize(model=TinyLM(), config={"train_batch_size": 4, "optimizer": {"type": "Lion"}})
    train(lion, data(2), loss=lm_loss)
    before = snapshot(lion)
    with pytest.raises(CheckpointError, match="belongs to AdamW"):
        lion.load_checkpoint(tmp_path, tag="t")
    assert same(before, snapshot(lion))  # the weights were not replaced before the refusal
    assert lion.load_checkpoint(tmp_path, tag="t", load_optimizer_states=False)[0] is not None


BAD_META = [
    ("global_steps", lambda m: m.update(global_steps="x")),
    ("global_steps", lambda m: m.update(global_steps=-1)),
    ("micro_steps", lambda m: m.update(micro_steps=2.5)),
    ("skipped_steps", lambda m: m.pop("skipped_steps")),
    ("param_names", lambda m: m.update(param_names="emb.weight")),
    ("model_aliases", lambda m: m.update(model_aliases=[1])),
    ("loss_scaler", lambda m: m["loss_scaler"].update(cur_scale="x")),
    ("loss_scaler", lambda m: m.update(loss_scaler=None)),
    ("param_groups[0].lr", lambda m: m["optimizer"]["param_groups"][0].update(lr="x")),
    ("param_groups[0].lr", lambda m: m["optimizer"]["param_groups"][0].update(lr=-1.0)),
    ("param_groups[0].betas", lambda m: m["optimizer"]["param_groups"][0].update(betas=[2, 0.9])),
    ("param_groups[0].betas", lambda m: m["optimizer"]["param_groups"][0].update(betas=[0.9])),
    ("param_groups[0].weight_decay", lambda m: m["optimizer"]["param_groups"][0].update(weight_decay=None)),
    ("param_groups[0].amsgrad", lambda m: m["optimizer"]["param_groups"][0].update(amsgrad="no")),
    ("optimizer.param_groups", lambda m: m["optimizer"].update(param_groups={})),
    ("belongs to None", lambda m: m["optimizer"].pop("class")),
    ("optimizer.scalars", lambda m: m["optimizer"].update(scalars=[])),
    ("lr_scheduler.last_batch_iteration", lambda m: m["lr_scheduler"].update(last_batch_iteration="x")),
    ("lr_scheduler.last_batch_iteration", lambda m: m["lr_scheduler"].update(last_batch_iteration=-5)),
    ("lr_scheduler.org_lrs", lambda m: m["lr_scheduler"].update(org_lrs=["a"])),
    ("belongs to WarmupLR", lambda m: m.update(lr_scheduler_class="WarmupLR")),
    ("client.safetensors does not hold", lambda m: m.update(client_state={"x": {"__tensor__": "client/9"}})),
    ("format", lambda m: m.update(format="zspeed-checkpoint-1")),
    ("mixes two saves", lambda m: m.update(save_id="0")),
    ("must hold a JSON object", lambda m: [m]),
]


@pytest.mark.parametrize("field,edit", BAD_META, ids=[f"{i}-{f}" for i, (f, _) in enumerate(BAD_META)])
def test_bad_meta_values_are_checkpoint_errors_and_change_nothing(tmp_path, field, edit):
    e = make("fp16_sched_clip")
    train(e, data(3), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="t", client_state={"x": torch.ones(2)})
    edit_meta(tmp_path / "t", edit)
    f = make("fp16_sched_clip")
    train(f, data(2), loss=lm_loss)
    before = snapshot(f)
    with pytest.raises(CheckpointError) as ei:
        f.load_checkpoint(tmp_path, tag="t")
    assert field in str(ei.value) and "meta.json" in str(ei.value)
    assert same(before, snapshot(f))
    train(f, data(1), loss=lm_loss)  # and it still trains


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.update({"emb.weight/exp_avg": torch.zeros(3)}), "has shape"),
    (lambda t: t.update({"emb.weight/exp_avg": torch.zeros(23, 11, dtype=torch.int32)}), "dtype"),
    (lambda t: t.pop("mid.bias/exp_avg_sq"), "no tensor 'exp_avg_sq'"),
    (lambda t: t.update({"nosuch/exp_avg": torch.zeros(1)}), "belongs to no parameter"),
    (lambda t: t.update({"mid.bias/step": torch.tensor(float("nan"))}), "step"),
])
def test_bad_optimizer_tensors_are_checkpoint_errors(tmp_path, edit, match):
    from safetensors.torch import load_file, save as st_save
    e = make("fp32")
    train(e, data(2), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="t")
    p = tmp_path / "t" / "optim.safetensors"
    tensors = {k: v.clone() for k, v in load_file(str(p)).items()}  # copies: Windows cannot rewrite a mapped file
    edit(tensors)
    rewrite(tmp_path / "t", "optim.safetensors", st_save(tensors, metadata={"format": "x"}))
    f = make("fp32")
    before = snapshot(f)
    with pytest.raises(CheckpointError, match=match):
        f.load_checkpoint(tmp_path, tag="t")
    assert same(before, snapshot(f))


# -- client_state (item 15) --------------------------------------------------------------------------
def test_client_state_round_trips_exactly(tmp_path):
    t = torch.arange(6).reshape(2, 3)
    state = {"__tensor__": 5, "a": {"__tensor__": "client/0"}, "b": {"__dict__": {"__tensor__": "x"}},
             "c": {"__tensor__": t}, "d": [t, {"__dict__": 1}], "e": {"__tensor__": "x", "more": 1}}
    e = make("fp32")
    e.save_checkpoint(tmp_path, client_state=state)
    _, got = make("fp32").load_checkpoint(tmp_path)
    assert got["__tensor__"] == 5 and got["a"] == {"__tensor__": "client/0"}
    assert got["b"] == {"__dict__": {"__tensor__": "x"}} and got["e"] == {"__tensor__": "x", "more": 1}
    assert set(got["c"]) == {"__tensor__"} and torch.equal(got["c"]["__tensor__"], t)
    assert torch.equal(got["d"][0], t) and got["d"][1] == {"__dict__": 1}
    e.save_checkpoint(tmp_path, tag="only", client_state={"__tensor__": "client/0"})
    assert make("fp32").load_checkpoint(tmp_path, tag="only")[1] == {"__tensor__": "client/0"}


# -- state dtypes on the cpu path (item 11; the nvme path: test_engine_nvme.py) -----------------------
@pytest.mark.parametrize("saved,configured", [("fp32", "int8"), ("int8", "fp32"), ("bf16", "int8"),
                                              ("fp32", "bf16"), ("int8", "bf16")])
def test_cpu_path_converts_states_to_the_configured_dtype(tmp_path, saved, configured):
    if not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")

    def eng(sd):
        c = {"train_batch_size": 4, "bf16": {"enabled": True},
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "state_dtype": sd}},
             "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
        return zspeed.initialize(model=TinyLM(), config=c)[0]

    a = eng(saved)
    train(a, data(3), loss=lm_loss)
    a.save_checkpoint(tmp_path)
    b = eng(configured)
    b.load_checkpoint(tmp_path)
    want = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[configured]
    states = list(b.optimizer.state.values())
    assert states and all(s["exp_avg"].dtype == want for s in states)
    assert all(("exp_avg_scale" in s) == (configured == "int8") for s in states)
    assert all(g["state_dtype"] == configured for g in b.optimizer.param_groups)
    # The converted moments are the saved ones up to the target's rounding.
    ref = {k: v for k, v in a.optimizer.state.items()}
    from zspeed.ops.adam import q8_dequantize

    def fp32_m(s, numel):
        if s["exp_avg"].dtype == torch.int8:
            m, v = torch.empty(numel), torch.empty(numel)
            q8_dequantize(s["exp_avg"].reshape(-1), s["exp_avg_scale"], s["exp_avg_sq"].reshape(-1),
                          s["exp_avg_sq_scale"], m, v)
            return m
        return s["exp_avg"].float().reshape(-1)
    for (pa, sa), (pb, sb) in zip(ref.items(), b.optimizer.state.items()):
        ma, mb = fp32_m(sa, pa.numel()), fp32_m(sb, pb.numel())
        tol = 2e-2 if "int8" in (saved, configured) else 8e-3  # 8-bit block quantization / bf16 rounding
        assert torch.allclose(ma, mb, rtol=tol, atol=tol * ma.abs().max().item())
    train(b, data(2), loss=lm_loss)


# -- full disks (items 2 and 9) -----------------------------------------------------------------------
def _full_disk_after(monkeypatch, budget: int):
    """os.write of checkpoint files fails with ENOSPC once ``budget`` bytes were written."""
    left = [budget]

    def write(fd, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), left[0])
        left[0] -= n
        return os.write(fd, data[:n])
    monkeypatch.setattr(cf, "_write", write)


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 0.9, 0.995])
@pytest.mark.parametrize("fixed_tag", [True, False])
def test_disk_full_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, fraction, fixed_tag):
    e = make("bf16_offload")
    train(e, data(2), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="best")
    total = sum(p.stat().st_size for p in (tmp_path / "best").iterdir())
    old = {p.name: p.read_bytes() for p in (tmp_path / "best").iterdir()}
    train(e, data(2), loss=lm_loss)
    _full_disk_after(monkeypatch, int(total * fraction))
    with pytest.raises(CheckpointError, match="disk is full"):
        e.save_checkpoint(tmp_path, tag="best" if fixed_tag else None)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (tmp_path / "best").iterdir()} == old
    assert (tmp_path / "latest").read_text() == "best" and leftovers(tmp_path) == []
    # (zero_to_fp32.py: DeepSpeed's converter's place, written beside a ZeRO stage 1-3 checkpoint)
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".")) == ["best", "latest", "zero_to_fp32.py", "zero_to_torch.py"]
    f = make("bf16_offload")
    assert f.load_checkpoint(tmp_path)[0].endswith("best") and f.global_steps == 2
    e.save_checkpoint(tmp_path, tag="best")  # with space again, the save works
    assert make("bf16_offload").load_checkpoint(tmp_path) and e.global_steps == 4


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="mounting a small tmpfs needs root on Linux")
def test_real_full_disk_on_a_small_tmpfs(tmp_path):
    import subprocess
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        def engine():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))  # ~140 KB per save
            return zspeed.initialize(model=model, config={"train_batch_size": 2, "optimizer": {"type": "AdamW"}})[0]
        e = engine()
        x = torch.randn(2, 64)
        e.backward(e(x).square().mean())
        e.step()
        e.save_checkpoint(mnt, tag="best")  # fits once, not twice: the replacing save runs out of space
        e.backward(e(x).square().mean())
        e.step()
        with pytest.raises(CheckpointError, match="disk is full"):
            e.save_checkpoint(mnt, tag="best")
        assert leftovers(mnt) == [] and sorted(n for n in os.listdir(mnt) if n[0] != ".") == ["best", "latest"]
        f = engine()
        assert f.load_checkpoint(mnt)[0].endswith("best") and f.global_steps == 1
    finally:
        done = subprocess.run(["umount", str(mnt)]).returncode == 0
        if not done:  # detach it anyway, then fail: something still holds a file of the checkpoint
            subprocess.run(["umount", "-l", str(mnt)])
        assert done, "a file of the checkpoint is still open or mapped after the load"


# -- shared folders: symlinks and predictable names (item 3) ----------------------------------------
@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_symlinks_planted_in_the_folder_are_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    d = tmp_path / "ck"
    d.mkdir()
    # Every name an older zspeed used for its temporary files, and 'latest' itself.
    for name in (f".latest.tmp-{os.getpid()}", f".model.safetensors.tmp-{os.getpid()}", "latest"):
        os.symlink(victim, d / name)
    e = make("fp32")
    seen = []
    cf._crash_hook = seen.append
    try:
        e.save_checkpoint(d, tag="t1")
        e.save_checkpoint(d, tag="t2")
    finally:
        cf._crash_hook = None
    assert victim.read_text() == "precious"
    assert not (d / "latest").is_symlink() and (d / "latest").read_text() == "t2"
    # A symlink standing where the lock file goes stops the save instead of being followed.
    (d / ".zspeed-lock").unlink()
    os.symlink(victim, d / ".zspeed-lock")
    with pytest.raises(CheckpointError):
        e.save_checkpoint(d, tag="t3")
    assert victim.read_text() == "precious" and not (d / "t3").exists()


def test_staging_names_are_unpredictable_and_leftovers_are_cleaned(tmp_path):
    e = make("fp32")
    names = []
    cf._crash_hook = lambda what: names.extend(n for n in os.listdir(tmp_path) if n.startswith(".zspeed-staging-"))
    try:
        e.save_checkpoint(tmp_path, tag="a")
        e.save_checkpoint(tmp_path, tag="a")
    finally:
        cf._crash_hook = None
    assert len(set(names)) == 2 and all(len(n) == len(".zspeed-staging-") + 16 for n in set(names))
    # Leftovers of killed saves: a staging folder, an old tag folder, a temporary 'latest'.
    (tmp_path / ".zspeed-staging-0123456789abcdef").mkdir()
    (tmp_path / ".zspeed-staging-0123456789abcdef" / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / ".zspeed-old-0123456789abcdef-a").mkdir()
    (tmp_path / ".zspeed-tmp-0123456789abcdef").write_bytes(b"a")
    assert make("fp32").load_checkpoint(tmp_path)[0].endswith("a")
    assert leftovers(tmp_path) == []
    (tmp_path / ".zspeed-staging-fedcba9876543210").mkdir()
    e.save_checkpoint(tmp_path, tag="b")
    assert leftovers(tmp_path) == []


def test_a_tag_whose_replacement_was_killed_between_renames_is_restored(tmp_path):
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="best")
    # The state a kill leaves after the old tag was renamed aside and before the new one came in.
    os.rename(tmp_path / "best", tmp_path / ".zspeed-old-0123456789abcdef-best")
    (tmp_path / ".zspeed-staging-0123456789abcdef").mkdir()
    f = make("fp32")
    assert f.load_checkpoint(tmp_path)[0].endswith("best") and f.global_steps == 1
    assert leftovers(tmp_path) == [] and (tmp_path / "best" / "manifest.json").exists()


# -- to-fp32 (item 9) -----------------------------------------------------------------------------------
def test_to_fp32(tmp_path):
    from safetensors.torch import load_file
    e = make("bf16_offload")
    train(e, data(3), loss=lm_loss)
    e.save_checkpoint(tmp_path)
    out = tmp_path / "w.safetensors"
    assert main_to_fp32([str(tmp_path), str(out)]) == 0
    w = load_file(str(out))
    masters = whole_masters(e)
    assert all(t.dtype == torch.float32 for t in w.values())
    for k, m in masters.items():
        assert torch.equal(w[k], m.cpu()), k  # the fp32 masters, not the bf16 weights
    assert "calls" in w and "out.weight" not in w  # buffer kept; tied alias stored once
    fresh = TinyLM()
    sd = dict(w)
    sd["out.weight"] = sd["emb.weight"]
    fresh.load_state_dict(sd)
    assert main_to_fp32([str(tmp_path / "nothing"), str(out)]) == 1
    assert main_to_fp32([str(tmp_path / "global_step3"), str(tmp_path / "w2.safetensors")]) == 0  # a tag folder


def test_deepspeeds_zero_to_fp32_functions(tmp_path):
    """deepspeed.utils.zero_to_fp32: the state dict (fp32 masters, buffers, tied names), into a
    model, and as files (torch or safetensors, one file or numbered shards with an index)."""
    import zspeed.utils.zero_to_fp32 as z
    from safetensors.torch import load_file
    e = make("bf16_offload")
    train(e, data(3), loss=lm_loss)
    e.save_checkpoint(tmp_path)
    masters = {k: m.cpu() for k, m in whole_masters(e).items()}
    for where, tag in ((tmp_path, None), (tmp_path, "global_step3"), (tmp_path / "global_step3", None)):
        sd = z.get_fp32_state_dict_from_zero_checkpoint(where, tag=tag)
        assert all(torch.equal(sd[k], m) for k, m in masters.items())
        assert sd["out.weight"] is sd["emb.weight"] and sd["calls"].dtype == torch.float32
    assert z.get_fp32_state_dict_from_zero_checkpoint(tmp_path, lazy_mode=True)["mid.weight"].contiguous() \
        .equal(masters["mid.weight"])
    with pytest.raises(ValueError, match="exclude_frozen_parameters=True"):
        z.get_fp32_state_dict_from_zero_checkpoint(tmp_path, exclude_frozen_parameters=True)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        z.get_fp32_state_dict_from_zero_checkpoint(tmp_path / "nothing")
    fresh = z.load_state_dict_from_zero_checkpoint(TinyLM(), tmp_path)
    assert torch.equal(fresh.mid.weight, masters["mid.weight"]) and fresh.out.weight is fresh.emb.weight
    # files: one torch file; safetensors shards with an index (tied weight stored once)
    files = z.convert_zero_checkpoint_to_fp32_state_dict(tmp_path, tmp_path / "bin")
    assert [os.path.basename(f) for f in files] == ["pytorch_model.bin"]
    got = torch.load(files[0])
    assert torch.equal(got["mid.weight"], masters["mid.weight"]) and "out.weight" in got
    files = z.convert_zero_checkpoint_to_fp32_state_dict(tmp_path, tmp_path / "st", max_shard_size=600,
                                                         safe_serialization=True)
    names = [os.path.basename(f) for f in files]
    assert names[-1] == "model.safetensors.index.json" and names[0] == f"model-00001-of-{len(names) - 1:05d}" \
        ".safetensors" and len(names) > 2, names
    index = json.loads(open(files[-1]).read())
    merged = {}
    for f in files[:-1]:
        part = load_file(f)
        assert all(index["weight_map"][k] == os.path.basename(f) for k in part)
        merged.update(part)
    assert set(merged) == set(masters) | {"calls"} and "out.weight" not in merged
    assert all(torch.equal(merged[k], m) for k, m in masters.items())
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in merged.values())
    with pytest.raises(ValueError, match="max_shard_size"):
        z.convert_zero_checkpoint_to_fp32_state_dict(tmp_path, tmp_path / "x", max_shard_size="lots")


def test_deepspeeds_convert_to_state_dict_in_a_dtype(tmp_path):
    """convert_zero_checkpoint_to_state_dict (DeepSpeed 0.19.8): floating-point tensors in the dtype
    asked (a name of OUTPUT_DTYPE_NAMES in any case, or a torch dtype), others as saved; tied
    names one tensor in the torch file; shard sizes counted in the output dtype; max_shard_size
    None writes one file; an unknown dtype is DeepSpeed's ValueError, before anything is written."""
    import zspeed.utils.zero_to_fp32 as z
    from safetensors.torch import load_file

    class WithSteps(TinyLM):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.arange(5))  # integers: never cast

    c = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
         "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    e, *_ = zspeed.initialize(model=WithSteps(), config=c)
    train(e, data(2), loss=lm_loss)
    e.save_checkpoint(tmp_path)
    masters = {k: m.cpu() for k, m in e._master_named().items()}
    for dtype, want in (("BF16", torch.bfloat16), ("float16", torch.float16), (torch.float32, torch.float32)):
        out = tmp_path / f"out-{want}"
        files = z.convert_zero_checkpoint_to_state_dict(tmp_path, out, dtype=dtype)
        got = torch.load(files[0])
        assert [os.path.basename(f) for f in files] == ["pytorch_model.bin"]
        for k, m in masters.items():
            assert got[k].dtype == want and torch.equal(got[k], m.to(want)), (dtype, k)
        assert got["out.weight"] is got["emb.weight"] and got["calls"].dtype == want
        assert got["seen"].dtype == torch.int64 and torch.equal(got["seen"], torch.arange(5))
    # shards are sized in the output dtype: half as many bytes in bf16 as in fp32 for the same limit
    n32 = len(z.convert_zero_checkpoint_to_state_dict(tmp_path, tmp_path / "s32", "fp32", max_shard_size=600,
                                                      safe_serialization=True))
    files = z.convert_zero_checkpoint_to_state_dict(tmp_path, tmp_path / "s16", "bf16", max_shard_size=600,
                                                    safe_serialization=True)
    assert 2 < len(files) < n32, (len(files), n32)
    index = json.loads(open(files[-1]).read())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size()
                                                  for f in files[:-1] for t in load_file(f).values())
    assert z.convert_zero_checkpoint_to_state_dict(tmp_path, tmp_path / "one", "fp16", max_shard_size=None,
                                                   safe_serialization=True)[0].endswith("model.safetensors")
    assert z.convert_zero_checkpoint_to_fp32_state_dict(tmp_path, tmp_path / "one32", max_shard_size=None)[0] \
        .endswith("pytorch_model.bin")
    with pytest.raises(ValueError, match="Unsupported output dtype 'int8'. Choose one of: bf16, bfloat16"):
        z.convert_zero_checkpoint_to_state_dict(tmp_path, tmp_path / "bad", dtype="int8")
    with pytest.raises(ValueError, match="Unsupported output dtype"):
        z.convert_zero_checkpoint_to_state_dict(tmp_path, tmp_path / "bad", dtype=torch.float64)
    assert not (tmp_path / "bad").exists()


def test_zero_checkpoints_carry_deepspeeds_zero_to_fp32_script(tmp_path, caplog):
    """At ZeRO stages 1-3 rank 0 writes save_dir/zero_to_fp32.py and zero_to_torch.py (DeepSpeed's
    converters' names and command lines, running zspeed's), executable; at stage 0 nothing (as
    DeepSpeed)."""
    import subprocess
    from safetensors.torch import load_file
    e = make("bf16_offload")
    train(e, data(2), loss=lm_loss)
    e.save_checkpoint(tmp_path / "ck")
    script = tmp_path / "ck" / "zero_to_fp32.py"
    assert script.is_file()
    if os.name != "nt":
        assert os.stat(script).st_mode & 0o100
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "ck"), str(tmp_path / "out"),
                          "--safe_serialization", "-t", "global_step2"], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    w = load_file(str(tmp_path / "out" / "model.safetensors"))
    for k, m in whole_masters(e).items():
        assert torch.equal(w[k], m.cpu()), k
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "nothing"), str(tmp_path / "o2")],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 1 and "zero_to_fp32.py:" in res.stderr and not (tmp_path / "o2").exists()
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "ck"), str(tmp_path / "o3"),
                          "--exclude_frozen_parameters"], capture_output=True, text=True, env=env)
    assert res.returncode == 1 and "exclude_frozen_parameters" in res.stderr
    # zero_to_torch.py (DeepSpeed 0.19.8): the same with --dtype, which it requires
    torch_script = tmp_path / "ck" / "zero_to_torch.py"
    assert torch_script.is_file()
    if os.name != "nt":
        assert os.stat(torch_script).st_mode & 0o100
    res = subprocess.run([sys.executable, str(torch_script), str(tmp_path / "ck"), str(tmp_path / "bf"),
                          "--dtype", "bf16"], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    w = torch.load(str(tmp_path / "bf" / "pytorch_model.bin"))
    for k, m in whole_masters(e).items():
        assert torch.equal(w[k], m.cpu().to(torch.bfloat16)), k
    res = subprocess.run([sys.executable, str(torch_script), str(tmp_path / "ck"), str(tmp_path / "o4")],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 2 and "--dtype" in res.stderr and not (tmp_path / "o4").exists()
    make("fp32").save_checkpoint(tmp_path / "s0")
    assert not (tmp_path / "s0" / "zero_to_fp32.py").exists() and not (tmp_path / "s0" / "zero_to_torch.py").exists()
    # A file system that refuses the permission change (or a missing file) is logged, not raised.
    import logging
    with caplog.at_level(logging.INFO, logger="zspeed"):
        e._change_recovery_script_permissions(str(tmp_path / "missing" / "zero_to_fp32.py"))
    assert any("Could not change permissions" in r.getMessage() for r in caplog.records)


def test_to_fp32_into_a_folder_and_failures_leave_no_temporary(tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file
    e = make("fp32")
    e.save_checkpoint(tmp_path / "ck")
    out = tmp_path / "out"
    out.mkdir()
    assert main_to_fp32([str(tmp_path / "ck"), str(out)]) == 0  # a folder receives model.safetensors
    assert os.listdir(out) == ["model.safetensors"] and "emb.weight" in load_file(str(out / "model.safetensors"))
    before = (out / "model.safetensors").read_bytes()
    _full_disk_after(monkeypatch, 100)
    assert main_to_fp32([str(tmp_path / "ck"), str(out)]) == 1
    monkeypatch.undo()
    assert "disk is full" in capsys.readouterr().err
    assert os.listdir(out) == ["model.safetensors"] and (out / "model.safetensors").read_bytes() == before
    (tmp_path / "file").write_text("x")
    assert main_to_fp32([str(tmp_path / "ck"), str(tmp_path / "file" / "w.safetensors")]) == 1
    assert "cannot create the output folder" in capsys.readouterr().err


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_a_tag_may_be_a_symlink_when_loading_and_is_never_replaced_through_one(tmp_path):
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="global_step1")
    os.symlink("global_step1", tmp_path / "best")
    assert make("fp32").load_checkpoint(tmp_path, tag="best")[0].endswith("best")
    with pytest.raises(CheckpointError, match="not a folder"):
        e.save_checkpoint(tmp_path, tag="best")
    assert os.readlink(tmp_path / "best") == "global_step1"


@pytest.mark.skipif(os.name == "nt", reason="the fallback for file systems without flock is POSIX; Windows locks "
                                           "through msvcrt.locking")
def test_a_file_system_without_locks_still_saves(tmp_path, monkeypatch):
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="t")
    e.save_checkpoint(tmp_path, tag="t")
    assert make("fp32").load_checkpoint(tmp_path)[0].endswith("t") and leftovers(tmp_path) == []


def test_a_save_killed_while_writing_the_recovery_scripts_leaves_nothing_for_good(tmp_path):
    """The temporary file of a recovery script whose save was killed (issue 52 #17) is removed by
    the next save in that folder, as the other leftovers of killed saves are; a user's own dot
    files are kept."""
    e = make("bf16_offload")
    train(e, data(2), loss=lm_loss)
    ck = tmp_path / "ck"
    ck.mkdir()
    left = [ck / ".zero_to_fp32.py.zspeed-tmp-0123456789abcdef", ck / ".zero_to_torch.py.zspeed-tmp-fedcba9876543210"]
    for f in left:
        f.write_text("half a script")
    mine = ck / ".zero_to_fp32.py.notes"
    mine.write_text("the user's")
    e.save_checkpoint(ck)
    assert not any(f.exists() for f in left) and mine.read_text() == "the user's"
    assert not [n for n in os.listdir(ck) if "zspeed-tmp" in n]


@pytest.mark.parametrize("stage,optim", [(0, "optim.safetensors"), (3, "optim.rank0.safetensors")])
def test_deepspeeds_checkpoint_file_names_point_at_the_files_saved(stage, tmp_path, optim):
    """DeepSpeed's path helpers (engine._get_ckpt_name, _get_optimizer_ckpt_name, _get_zero_ckpt_name,
    deepspeed.checkpoint.utils.get_model_ckpt_name_for_rank) name the files zspeed writes: whole
    files where rank 0 writes the state, each rank's part where the state is kept in pieces."""
    from zspeed.checkpoint import get_model_ckpt_name_for_rank
    c = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
         "zero_optimization": {"stage": stage}}
    e, *_ = zspeed.initialize(model=TinyLM(), config=c)
    train(e, data(2), loss=lm_loss)
    assert e.save_checkpoint(tmp_path, tag="t1")
    model = e._get_ckpt_name(str(tmp_path), "t1")
    assert model == str(tmp_path / "t1" / "model.safetensors") and os.path.isfile(model)
    assert get_model_ckpt_name_for_rank(str(tmp_path / "t1"), "00") == model
    with pytest.raises(ValueError, match="no model parallelism"):
        get_model_ckpt_name_for_rank(str(tmp_path / "t1"), "01")
    name = e._get_optimizer_ckpt_name(str(tmp_path), "t1", 0)
    assert name == str(tmp_path / "t1" / optim) and os.path.isfile(name)
    assert e._get_zero_ckpt_name(str(tmp_path), "t1") == name
    e.close()
