"""Checkpoint folders that someone else can write (issue 24, "untrusted files").

What a planted entry (a FIFO, a device, a folder, a symbolic link) or a crafted file can
do is bounded: a load or `zspeed to-fp32` never blocks on it, never reads more than the
checkpoint is expected to hold, never writes into the checkpoint it reads, and never
renames what it did not create; the refusal is a CheckpointError that names the file.
Anything that could block runs in a thread with a time limit (a reader stuck on a FIFO is
released by opening the FIFO for writing) or in a subprocess with a timeout, so a
regression fails instead of hanging the suite. The nvme_path sweep is test_nvme_sweep.py,
the trace file test_trace.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")
pytest.importorskip("safetensors", reason="zspeed checkpoints need safetensors")

os.environ["ZSPEED_DEVICE"] = "cpu"
import zspeed  # noqa: E402
from zspeed.runtime.checkpoint import CheckpointError
from zspeed.runtime.checkpoint_fp32 import main_to_fp32  # noqa: E402
from engine_helpers import TinyLM, lm_loss, native_ops_available, token_data as data, train  # noqa: E402
from checkpoint_helpers import leftovers, rewrite, same, snapshot  # noqa: E402

POSIX = sys.platform != "win32"
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
needs_symlink = pytest.mark.skipif(not POSIX, reason="symlinks need privileges on Windows")
LIMIT = 60  # seconds a load, a start or a command may take here before it counts as blocked


def make(stage: int = 0):
    c = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    if stage:
        c["zero_optimization"] = {"stage": stage}
    e, *_ = zspeed.initialize(model=TinyLM(), config=c)
    return e


def saved(tmp_path, tag="t", stage=0, **kw) -> Path:
    e = make(stage)
    train(e, data(2), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag=tag, **kw)
    return tmp_path / tag


def _release(fifos) -> None:
    """Lets a reader blocked opening one of the FIFOs go on (it then reads end-of-file)."""
    for f in fifos:
        with contextlib.suppress(OSError):
            os.close(os.open(str(f), os.O_WRONLY | os.O_NONBLOCK))


def finishes(fn, fifos=(), limit=LIMIT):
    """fn()'s result, or the exception it raised, from a thread given ``limit`` seconds; a
    call still running then (blocked on a FIFO) fails the test after it is released."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit)
    if th.is_alive():
        _release(fifos)
        th.join(10)
        pytest.fail(f"still blocked after {limit} s (on a FIFO?)")
    return box.get("error", box.get("value"))


def cli(*args, timeout=LIMIT * 2):
    env = dict(os.environ, ZSPEED_DEVICE="cpu")
    try:
        return subprocess.run([sys.executable, "-m", "zspeed", *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"zspeed {' '.join(map(str, args))} still running after {timeout} s (blocked on a FIFO?)")


# -- item 2: FIFOs and devices in a checkpoint folder ---------------------------------------------------
@needs_fifo
@pytest.mark.parametrize("name", ["latest", "meta.json", "model.safetensors", "master.safetensors",
                                  "optim.safetensors", "manifest.json", ".zspeed-lock"])
def test_a_fifo_in_a_checkpoint_is_refused_without_blocking(tmp_path, name):
    tag = saved(tmp_path)
    p = tmp_path / name if name in ("latest", ".zspeed-lock") else tag / name
    p.unlink()
    os.mkfifo(p)
    f = make()
    before = snapshot(f)
    err = finishes(lambda: f.load_checkpoint(tmp_path), [p])
    assert isinstance(err, CheckpointError), err
    assert f"{name}' is not a regular file" in str(err) and "FIFO" in str(err)
    assert same(before, snapshot(f)) and stat.S_ISFIFO(os.lstat(p).st_mode)


@needs_fifo
def test_to_fp32_refuses_a_fifo_without_blocking(tmp_path):
    tag = saved(tmp_path / "ck")
    (tag / "model.safetensors").unlink()
    os.mkfifo(tag / "model.safetensors")
    res = cli("to-fp32", tag, tmp_path / "w.safetensors")
    assert res.returncode == 1 and "model.safetensors' is not a regular file" in res.stderr, res
    assert not (tmp_path / "w.safetensors").exists()


@needs_symlink
@pytest.mark.parametrize("name,target,kind", [("meta.json", "/dev/zero", "character device"),
                                              ("model.safetensors", "/dev/null", "character device"),
                                              ("master.safetensors", "DIR", "folder")])
def test_a_device_or_folder_in_a_checkpoint_is_refused(tmp_path, name, target, kind):
    if target.startswith("/dev/") and not os.path.exists(target):
        pytest.skip(f"no {target}")
    tag = saved(tmp_path)
    (tag / name).unlink()
    if target == "DIR":
        (tag / name).mkdir()
    else:
        os.symlink(target, tag / name)
    err = finishes(lambda: make().load_checkpoint(tmp_path))
    assert isinstance(err, CheckpointError) and f"{name}' is not a regular file (a {kind}" in str(err), err


# -- item 11: crafted safetensors files are checked before anything is read -----------------------------
class _Spy:
    """Wraps safetensors.safe_open and records (file name, tensor name) of every tensor whose
    data were read (get_tensor, or get_slice, which reads when indexed)."""

    def __init__(self, monkeypatch):
        import safetensors
        self.read: list = []
        real = safetensors.safe_open
        spy = self

        class Handle:
            def __init__(self, path, *a, **k):
                self.file = os.path.basename(path)
                self.h = real(path, *a, **k)

            def __enter__(self):
                self.h.__enter__()
                return self

            def __exit__(self, *exc):
                return self.h.__exit__(*exc)

            def get_tensor(self, k):
                spy.read.append((self.file, k))
                return self.h.get_tensor(k)

            def get_slice(self, k):
                spy.read.append((self.file, k))
                return self.h.get_slice(k)

            def __getattr__(self, a):
                return getattr(self.h, a)
        monkeypatch.setattr(safetensors, "safe_open", Handle)


def _add_tensors(tag: Path, name: str, edit) -> None:
    from safetensors import safe_open
    from safetensors.torch import save as st_save
    with safe_open(str(tag / name), framework="pt") as f:
        meta = f.metadata()
        # Copies: safetensors maps the file, and Windows cannot rewrite a file still mapped.
        tensors = {k: f.get_tensor(k).clone() for k in f.keys()}
    edit(tensors)
    rewrite(tag, name, st_save(tensors, metadata=meta))


@pytest.mark.parametrize("file,edit,match", [
    ("model.safetensors", lambda t: t.update(huge=torch.zeros(1 << 20)), "unexpected 1: huge"),
    ("model.safetensors", lambda t: t.update({"mid.weight": torch.zeros(1000, 11)}),
     r"mid.weight: checkpoint \(1000, 11\) vs model \(11, 11\)"),
    ("master.safetensors", lambda t: t.update(huge=torch.zeros(1 << 20)), "unexpected 1: huge"),
    ("master.safetensors", lambda t: t.update({"mid.bias": torch.zeros(1 << 20)}), "mid.bias: checkpoint"),
    ("optim.safetensors", lambda t: t.update({"huge/exp_avg": torch.zeros(1 << 20)}), "belongs to no parameter"),
    ("optim.safetensors", lambda t: t.update({"mid.bias/exp_avg": torch.zeros(1 << 20)}), "has shape"),
])
def test_an_unexpected_or_oversized_tensor_is_refused_before_it_is_read(tmp_path, monkeypatch, file, edit, match):
    tag = saved(tmp_path)
    _add_tensors(tag, file, edit)
    f = make()
    before = snapshot(f)
    spy = _Spy(monkeypatch)
    with pytest.raises(CheckpointError, match=match):
        f.load_checkpoint(tmp_path)
    suspects = {"huge", "mid.weight", "mid.bias", "huge/exp_avg", "mid.bias/exp_avg"}
    assert not [k for f, k in spy.read if f == file and k in suspects], spy.read
    assert same(before, snapshot(f))


def test_tensors_nobody_asked_for_are_skipped_unread(tmp_path, monkeypatch):
    tag = saved(tmp_path, client_state={"x": torch.arange(4.0)})
    _add_tensors(tag, "model.safetensors", lambda t: t.update(extra=torch.zeros(1 << 16)))
    _add_tensors(tag, "client.safetensors", lambda t: t.update({"client/7": torch.zeros(1 << 16)}))
    spy = _Spy(monkeypatch)
    f = make()
    path, client = f.load_checkpoint(tmp_path, load_module_strict=False)
    assert path.endswith("t") and torch.equal(client["x"], torch.arange(4.0))
    names = {k for _, k in spy.read}
    assert "extra" not in names and "client/7" not in names and "client/0" in names, spy.read


def _header(tag: Path, name: str):
    raw = (tag / name).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return raw, n, json.loads(raw[8:8 + n])


def _with_header(tag: Path, name: str, head: dict, data: bytes) -> None:
    text = json.dumps(head).encode()
    text += b" " * (-len(text) % 8)
    rewrite(tag, name, len(text).to_bytes(8, "little") + text + data)


@pytest.mark.parametrize("edit,match", [
    (lambda h, d: (h, d + b"\0" * 8), "bytes after its last tensor"),
    (lambda h, d: ({**h, "mid.bias": {**h["mid.bias"], "data_offsets": [0, 44]}}, d), "overlap"),
    (lambda h, d: ({**h, "mid.bias": {**h["mid.bias"], "data_offsets": [len(d), len(d) + 44]}}, d),
     "beyond the end"),
    (lambda h, d: ({**h, "mid.bias": {**h["mid.bias"], "shape": [12]}}, d), "12 elements"),
    (lambda h, d: ({**h, "mid.bias": {**h["mid.bias"], "dtype": "C64"}}, d), "dtype 'C64'"),
    (lambda h, d: ({**h, "mid.bias": {**h["mid.bias"], "shape": [-11]}}, d), "shape"),
])
def test_malformed_safetensors_headers_are_refused(tmp_path, edit, match):
    tag = saved(tmp_path)
    raw, n, head = _header(tag, "master.safetensors")
    head, body = edit(head, raw[8 + n:])
    _with_header(tag, "master.safetensors", head, body)
    with pytest.raises(CheckpointError, match=match) as ei:
        make().load_checkpoint(tmp_path)
    assert "master.safetensors" in str(ei.value)


def test_a_header_longer_than_the_file_or_the_bound_is_refused(tmp_path):
    tag = saved(tmp_path)
    raw = (tag / "model.safetensors").read_bytes()
    for n in (len(raw), 1 << 62):
        rewrite(tag, "model.safetensors", n.to_bytes(8, "little") + raw[8:])
        with pytest.raises(CheckpointError, match="header"):
            make().load_checkpoint(tmp_path)


# -- item 16 and size: bounded JSON -------------------------------------------------------------------
def _nested(depth: int):
    v: list = []
    for _ in range(depth):
        v = [v]
    return v


@pytest.mark.parametrize("depth", [900, 100_000])
def test_deeply_nested_json_is_a_checkpoint_error(tmp_path, depth):
    tag = saved(tmp_path)
    meta = json.loads((tag / "meta.json").read_text())
    meta["client_state"] = {"deep": "DEEP"}
    text = json.dumps(meta).replace('"DEEP"', "[" * depth + "]" * depth)
    rewrite(tag, "meta.json", text.encode())
    f = make()
    before = snapshot(f)
    with pytest.raises(CheckpointError, match=r"meta.json' is nested more than \d+ levels deep"):
        f.load_checkpoint(tmp_path)
    assert same(before, snapshot(f))
    # The save refuses what the load would refuse, before writing anything.
    e = make()
    with pytest.raises(CheckpointError, match="nested"):
        e.save_checkpoint(tmp_path / "new", client_state={"deep": _nested(900)})
    assert not (tmp_path / "new").exists()


def test_json_larger_than_the_bound_is_refused(tmp_path, monkeypatch):
    import zspeed.runtime.checkpoint_read as cr
    tag = saved(tmp_path)
    monkeypatch.setattr(cr, "_MAX_JSON", (tag / "meta.json").stat().st_size - 1)
    with pytest.raises(CheckpointError, match="meta.json' is larger than"):
        make().load_checkpoint(tmp_path)


# -- item 4: to-fp32 never writes into the checkpoint it reads -------------------------------------------
def _state(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("inp,out", [
    ("ck/t", "ck/t"), ("ck/t", "ck/t/model.safetensors"), ("ck", "ck/latest"), ("ck/t", "ck/latest"),
    ("ck", "ck"), ("ck", "ck/"), ("ck", "ck/t/meta.json"), ("ck", "ck/.zspeed-lock"), ("ck", "ck/t/new.safetensors"),
    ("ck", "link/model.safetensors"), ("ck/t", "linkdir"),
])
def test_to_fp32_refuses_an_output_inside_its_input(tmp_path, inp, out):
    saved(tmp_path / "ck")
    if POSIX:
        os.symlink(tmp_path / "ck" / "t", tmp_path / "link")
        os.symlink(tmp_path / "ck", tmp_path / "linkdir")
    elif "link" in out:
        pytest.skip("symlinks need privileges on Windows")
    before = _state(tmp_path / "ck")
    outp = str(tmp_path / out) + ("/" if out.endswith("/") else "")
    assert main_to_fp32([str(tmp_path / inp), outp]) == 1
    assert _state(tmp_path / "ck") == before  # nothing written, nothing replaced
    assert not list(tmp_path.glob("**/.*zspeed-tmp-*"))


def test_to_fp32_cli_refuses_its_own_tag_folder_and_latest(tmp_path):
    tag = saved(tmp_path / "ck")
    before = _state(tmp_path / "ck")
    for args in ((tag, tag), (tmp_path / "ck", tmp_path / "ck" / "latest")):
        res = cli("to-fp32", *args)
        assert res.returncode == 1 and "inside the checkpoint" in res.stderr, res
    assert _state(tmp_path / "ck") == before
    res = cli("to-fp32", tag, tmp_path / "ck" / "w.safetensors")  # beside the tags: allowed, as before
    assert res.returncode == 0, res


# -- low items: mixed saves, planted old folders, the parameter-groups message ----------------------------
def _set_save_id(tag: Path, name: str, new: str) -> None:
    raw, n, head = _header(tag, name)
    old = head["__metadata__"]["save_id"]
    assert len(new) == len(old)
    text = raw[8:8 + n].replace(f'"save_id":"{old}"'.encode(), f'"save_id":"{new}"'.encode())
    rewrite(tag, name, raw[:8] + text + raw[8 + n:])


@pytest.mark.skipif(not native_ops_available(), reason="ZeRO-3 needs libzspeed")
@pytest.mark.parametrize("name", ["master.rank0.safetensors", "optim.rank0.safetensors", "model.safetensors"])
def test_a_file_of_another_save_is_refused(tmp_path, name):
    tag = saved(tmp_path, stage=3)  # one process of ZeRO-3 saves its partition as rank files
    _set_save_id(tag, name, "0123456789abcdef")
    f = make(3)
    before = snapshot(f)
    with pytest.raises(CheckpointError, match=rf"{name}' belongs to save '0123456789abcdef'.*mixes two saves"):
        f.load_checkpoint(tmp_path)
    assert same(before, snapshot(f))


@needs_symlink
def test_a_planted_old_folder_symlink_is_never_restored_as_a_tag(tmp_path):
    saved(tmp_path, tag="best")
    victim = tmp_path.parent / (tmp_path.name + "-victim")
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    os.symlink(victim, tmp_path / ".zspeed-old-0123456789abcdef-evil")
    os.symlink(victim, tmp_path / ".zspeed-old-fedcba9876543210-best2")
    assert make().load_checkpoint(tmp_path)[0].endswith("best")
    assert not os.path.lexists(tmp_path / "evil") and not os.path.lexists(tmp_path / "best2")
    assert leftovers(tmp_path) == [] and (victim / "keep.txt").read_text() == "precious"


def test_different_parameter_names_are_named_in_the_error(tmp_path):
    saved(tmp_path)
    m = TinyLM()
    e, *_ = zspeed.initialize(model=m, model_parameters=[m.mid.weight, m.emb.weight, m.mid.bias],
                              config={"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW"}})
    with pytest.raises(CheckpointError, match=r"different parameter groups.*parameter 0 of group 0 is "
                                              r"'emb.weight' in the checkpoint, 'mid.weight' in this engine"):
        e.load_checkpoint(tmp_path)
    m2 = TinyLM()
    e2, *_ = zspeed.initialize(model=m2, model_parameters=[{"params": [m2.emb.weight, m2.mid.weight]},
                                                           {"params": [m2.mid.bias]}],
                               config={"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW"}})
    with pytest.raises(CheckpointError, match=r"groups of 3 parameters in the checkpoint, of 2, 1 in this engine"):
        e2.load_checkpoint(tmp_path)


# -- save_16bit_model never writes through a planted name ----------------------------------------------
@needs_symlink
@pytest.mark.parametrize("name", ["m.safetensors", "pytorch_model.bin"])
def test_save_16bit_model_never_writes_through_a_symlink(tmp_path, name):
    e = make()
    train(e, data(1), loss=lm_loss)
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / name).symlink_to(outside)
    for stale in (name + ".tmp",):  # the name the old code wrote to first
        (folder / stale).symlink_to(outside)
    with pytest.raises(CheckpointError, match="not a regular file"):
        e.save_16bit_model(str(folder), name)
    assert outside.read_bytes() == b"keep me"
    (folder / name).unlink()
    assert e.save_16bit_model(str(folder), name)  # a plain target: written, and again over itself
    assert e.save_16bit_model(str(folder), name)
    assert outside.read_bytes() == b"keep me" and (folder / name).is_file() and not (folder / name).is_symlink()
    if name.endswith(".safetensors"):
        from safetensors.torch import load_file
        got = load_file(str(folder / name))
    else:
        import torch
        got = torch.load(str(folder / name))
    assert set(got) >= {"mid.weight", "emb.weight"}
