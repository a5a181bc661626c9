"""Checkpoints of data-parallel engines (ranks started as torchrun would, Gloo on the CPU):
round trips across world sizes (2 -> 2, 2 -> 3, 2 -> 1, 3 -> 1, 1 -> 2) with no offload,
cpu and nvme offload, fp32 and bf16 models, fp32 and 8-bit optimizer states, ZeRO stages
0-2; to-fp32 of partitioned checkpoints; a rank that fails or is killed during a save; a
corrupted partition file.

What is compared, and how closely:
- the same world size resumes bit for bit (every piece's master and state, every state
  dtype, and the weights after further steps);
- at another world size the masters and fp32/bf16 states are the same bits (re-partitioning
  only cuts and joins them); 8-bit states whose pieces are cut differently are dequantized
  and requantized with the new pieces' blocks, which moves each value by at most one
  quantization step: |delta m| <= max|m| / 127 and |delta sqrt(v)| <= max sqrt(v) / 255
  (optim.h's maps, with the parameter's maximum as the bound of every block's);
- continuing at another world size sums the ranks' gradients in another order, so the
  weights after two more steps match within test_dp.py's tolerances (fp32: 1e-5 relative,
  bf16: 2e-2), and within 2e-3 with requantized 8-bit states."""
import json
import os
import signal
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the runtime needs torch")
pytest.importorskip("safetensors", reason="zspeed checkpoints need safetensors")

import ckpt_dp_helpers as h  # noqa: E402
from distrun import run_ranks  # noqa: E402
from engine_helpers import native_ops_available, zspeed_site  # noqa: E402

from zspeed.runtime.checkpoint import CheckpointError
from zspeed.runtime.checkpoint_fp32 import main_to_fp32  # noqa: E402
from zspeed.runtime.partition import PartitionPlan  # noqa: E402


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """CPU-only by design (the ranks are CPU processes; so is the one-process side): ZSPEED_DEVICE=cpu for each test,
    also under tests/gpu/gate.py (per test, so that other files keep the GPU)."""
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")

pytestmark = pytest.mark.skipif(not native_ops_available(), reason="the offloaded paths need libzspeed")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KINDS = list(h.KINDS)
PHASE = f"import sys; sys.path.insert(0, {str(HERE)!r}); import ckpt_dp_helpers; ckpt_dp_helpers.run_phase()"


def _env(**extra) -> dict:
    env = {"PYTHONPATH": os.pathsep.join([zspeed_site()] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p])}
    env.update(extra)
    return env


def _ranks(n: int, code: str, timeout: float = 300, **env) -> list:
    res = run_ranks(n, code, env=_env(**env), timeout=timeout)
    for r in res:
        assert r.returncode == 0, r
    return res


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every kind of engine: one process trains and saves ("one"); two ranks load it and go
    on, then train, save ("two") and go on, then load "two" and go on; three ranks load
    "two", save it again ("three") and go on. Returns (root, results by world size)."""
    root = tmp_path_factory.mktemp("ckdp")
    one = {}
    for kind in KINDS:
        e = h.make(kind, str(root / kind / "nvme"))
        h.train(e, h.BEFORE)
        e.save_checkpoint(root / kind / "one", client_state={"kind": kind})
        one[kind] = {"saved": h.dump(e)}
        h.train(e, h.AFTER)
        one[kind]["saved_after"] = h.dump(e)
        e.close()
    out = {1: [one]}
    for n, phase in ((2, "two"), (3, "three")):
        _ranks(n, PHASE, ZS_CKPT_PHASE=json.dumps([phase, str(root), KINDS, str(root / phase)]))
        out[n] = [torch.load(f"{root / phase}.{r}.pt", weights_only=False) for r in range(n)]
    return root, out


def _int8(kind: str) -> bool:
    return h.KINDS[kind][2] == "int8"


def _check_state(got: dict, want: dict, kind: str, requantized: bool) -> None:
    """Merged masters and states: the same bits, or for requantized 8-bit states within one
    quantization step (module docstring)."""
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name]["master"], want[name]["master"]), name
        a, b = got[name]["state"], want[name]["state"]
        assert a.keys() == b.keys(), name
        for k in b:
            if not torch.is_tensor(b[k]):
                assert a[k] == b[k], (name, k)
            elif requantized and _int8(kind) and k == "exp_avg":
                bound = b[k].abs().max() / 127 * 1.001 + 1e-30
                assert (a[k] - b[k]).abs().max() <= bound, (name, k)
            elif requantized and _int8(kind) and k == "exp_avg_sq":
                ra, rb = a[k].sqrt(), b[k].sqrt()
                assert (ra - rb).abs().max() <= rb.max() / 255 * 1.001 + 1e-30, (name, k)
            else:
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (name, k)


def _check_model(got: dict, want: dict, kind: str, exact: bool) -> None:
    precision = h.KINDS[kind][1]
    rtol, atol = (0, 0) if exact else (2e-2, 2e-2) if precision == "bf16" else \
        (2e-3, 2e-3) if _int8(kind) else (1e-5, 1e-6)
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k].float(), want[k].float(), rtol=rtol, atol=atol, msg=k)


def _merged(dumps: list, what: str, kind: str) -> dict:
    return h.merge([d[kind][what] for d in dumps])


# -- round trips ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_same_world_size_resumes_bit_exactly(runs, kind):
    root, out = runs
    for d in out[2]:
        r = d[kind]
        assert h.same(r["load2"]["pieces"], r["saved"]["pieces"]) and h.same(r["load2"]["model"], r["saved"]["model"])
        assert r["load2"]["counters"] == r["saved"]["counters"] and r["load2"]["lr"] == r["saved"]["lr"]
        assert h.same(r["load2_after"], r["saved_after"])  # and the continuation is the uninterrupted run's
        assert r["path2"].endswith("global_step3")
        # client_state is rank 0's (every rank passed its own)
        assert r["client2"]["kind"] == kind and torch.equal(r["client2"]["t"], torch.arange(3))


def _check_resumed(loaded: list, saved: list, kind: str, load: str) -> None:
    """The ranks' dumps ``loaded[r][kind][load]`` (after loading a checkpoint of another world
    size) hold the saving engine's state (the same bits; 8-bit states within one step), weights,
    counters and lr, and ``...[load + "_after"]`` continued as it did, within tolerance."""
    ref = saved[0][kind]
    _check_state(_merged(loaded, load, kind), _merged(saved, "saved", kind), kind, requantized=True)
    for d in loaded:
        got = d[kind]
        _check_model(got[load]["model"], ref["saved"]["model"], kind, exact=True)
        assert got[load]["counters"] == ref["saved"]["counters"] and got[load]["lr"] == ref["saved"]["lr"]
        _check_model(got[load + "_after"]["model"], ref["saved_after"]["model"], kind, exact=False)


@pytest.mark.parametrize("kind", KINDS)
def test_two_ranks_to_three(runs, kind):
    root, out = runs
    _check_resumed(out[3], out[2], kind, "load2")
    assert all(d[kind]["client2"]["kind"] == kind for d in out[3])


@pytest.mark.parametrize("kind", KINDS)
def test_one_process_to_two_ranks(runs, kind):
    root, out = runs
    _check_resumed(out[2], out[1], kind, "load1")
    assert all(d[kind]["client1"] == {"kind": kind} for d in out[2])


@pytest.mark.parametrize("kind", KINDS)
def test_two_and_three_ranks_to_one_process(runs, kind):
    root, out = runs
    want = _merged(out[2], "saved", kind)
    e = h.make(kind, str(root / kind / "nvme"))
    path, client = e.load_checkpoint(root / kind / "two")
    assert path.endswith("global_step3") and client["kind"] == kind
    got = h.dump(e)
    _check_state(h.merge([got]), want, kind, requantized=True)
    _check_model(got["model"], out[2][0][kind]["saved"]["model"], kind, exact=True)
    h.train(e, h.AFTER)
    _check_model(h.dump(e)["model"], out[2][0][kind]["saved_after"]["model"], kind, exact=False)
    e.close()
    # "three" was saved by three ranks right after they loaded "two": the same state.
    e = h.make(kind, str(root / kind / "nvme"))
    e.load_checkpoint(root / kind / "three")
    got = h.dump(e)
    _check_state(h.merge([got]), want, kind, requantized=True)
    assert got["counters"] == out[2][0][kind]["saved"]["counters"]
    e.close()


def test_weights_only_and_nothing_to_load(runs):
    root, out = runs
    saved = out[2][0]["cpu-bf16"]["saved"]
    merged = h.merge([d["cpu-bf16"]["weights_only"] for d in out[3]])
    for d in out[3]:
        r = d["cpu-bf16"]
        assert r["weights_only_path"].endswith("global_step3") and r["nothing"] == (None, None)
        assert h.same(r["weights_only"]["model"], saved["model"])
        # the step counters come back without the optimizer states, as in DeepSpeed
        assert r["weights_only"]["counters"] == saved["counters"] and saved["counters"][0] == 3
        assert all(not p["state"] for p in r["weights_only"]["pieces"].values())  # no optimizer state
    for name, p in merged.items():
        assert torch.equal(p["master"], saved["model"][name].reshape(-1).float()), name


def test_malformed_partition_metadata_is_refused(runs, tmp_path):
    import shutil
    from checkpoint_helpers import edit_meta
    root, out = runs
    for field, edit in [("world_size", lambda m: m.update(world_size=0)),
                        ("partition.numels", lambda m: m["partition"]["numels"][0].append(4)),
                        ("partition.align", lambda m: m["partition"].update(align=0)),
                        ("partition", lambda m: m.pop("partition"))]:
        d = tmp_path / field
        shutil.copytree(root / "cpu-fp32" / "two", d)
        edit_meta(d / "global_step3", edit)
        e = h.make("cpu-fp32", str(tmp_path / "nvme"))
        with pytest.raises(CheckpointError, match=f"field '{field}'"):
            e.load_checkpoint(d)
        e.close()


def _edit_rank_meta(tag: Path, name: str, old: str, new: str) -> None:
    """Replaces one value of a rank file's safetensors metadata (same length: the header keeps
    its size) and the file's manifest entry, as a copy from another save would look."""
    from checkpoint_helpers import rewrite
    raw = (tag / name).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert len(old) == len(new) and raw[8:8 + n].count(old.encode()) == 1
    rewrite(tag, name, raw[:8] + raw[8:8 + n].replace(old.encode(), new.encode()) + raw[8 + n:])


def test_rank_files_of_another_save_or_rank_are_refused(runs, tmp_path):
    import shutil
    root, _ = runs
    for case, name in (("save", "optim.rank1.safetensors"), ("save", "master.rank0.safetensors"),
                       ("rank", "master.rank1.safetensors")):
        d = tmp_path / f"{case}-{name}"
        shutil.copytree(root / "cpu-fp32" / "two", d)
        tag = d / "global_step3"
        sid = json.loads((tag / "meta.json").read_text())["save_id"]
        if case == "save":
            _edit_rank_meta(tag, name, f'"save_id":"{sid}"', '"save_id":"0123456789abcdef"')
            match = rf"{name}' belongs to save '0123456789abcdef'.*mixes two saves"
        else:
            _edit_rank_meta(tag, name, '"rank":"1"', '"rank":"0"')
            match = rf"{name}' holds the partition of rank '0', not of rank 1"
        e = h.make("cpu-fp32", str(tmp_path / "nvme"))
        with pytest.raises(CheckpointError, match=match):
            e.load_checkpoint(d)
        e.close()


def test_a_staging_folder_is_only_reopened_as_rank_0_created_it(tmp_path):
    from zspeed.runtime.checkpoint_files import SaveTransaction, StagingWriter
    with SaveTransaction(tmp_path, "t") as tx:
        owner = os.lstat(tmp_path / tx.staging).st_uid
        w = StagingWriter.open_existing(tmp_path, tx.staging, owner)
        entry = w.write_bytes("x", b"data")
        w.close()
        assert entry["bytes"] == 4 and (tmp_path / tx.staging / "x").read_bytes() == b"data"
        with pytest.raises(CheckpointError, match="not the name of a zspeed staging folder"):
            StagingWriter.open_existing(tmp_path, "../" + tx.staging[3:], owner)
        if sys.platform != "win32":
            with pytest.raises(CheckpointError, match="belongs to user"):
                StagingWriter.open_existing(tmp_path, tx.staging, owner + 1)
            fake = ".zspeed-staging-" + "0" * 16
            os.symlink(tx.staging, tmp_path / fake)
            with pytest.raises(CheckpointError, match="is not a folder"):
                StagingWriter.open_existing(tmp_path, fake, owner)
            os.unlink(tmp_path / fake)
    assert sorted(os.listdir(tmp_path)) == [".zspeed-lock"]  # not committed: the staging folder is gone


def test_partition_files(runs):
    """Rank 0 writes the shared files, every rank its own pieces (never the padding), keyed by
    parameter and offset as the partition plan recorded in meta.json says."""
    root, out = runs
    tag = root / "cpu-int8" / "two" / "global_step3"
    names = sorted(os.listdir(tag))
    assert names == ["client.safetensors", "manifest.json", "master.rank0.safetensors", "master.rank1.safetensors",
                     "meta.json", "model.safetensors", "optim.rank0.safetensors", "optim.rank1.safetensors"]
    meta = json.loads((tag / "meta.json").read_text())
    manifest = json.loads((tag / "manifest.json").read_text())
    assert meta["world_size"] == manifest["world_size"] == 2
    part = meta["partition"]
    from safetensors import safe_open
    for rank in range(2):
        plan = PartitionPlan(part["numels"], 2, rank, part["align"], part["unit_elems"])
        want = {f"{meta['param_names'][gi][pc.param]}@{pc.offset}": pc.length
                for gi in range(len(plan.groups)) for pc in plan.pieces(gi)}
        with safe_open(str(tag / f"master.rank{rank}.safetensors"), "pt") as f:
            assert {k: f.get_slice(k).get_shape()[0] for k in f.keys()} == want
        with safe_open(str(tag / f"optim.rank{rank}.safetensors"), "pt") as f:
            keys = set(f.keys())
            assert keys == {f"{k}/{s}" for k in want for s in ("exp_avg", "exp_avg_sq", "exp_avg_scale",
                                                                 "exp_avg_sq_scale")}
            assert json.loads(f.metadata()["scalars"]) == {k: {"step": 3} for k in want}
    # ZeRO stage 0 (every rank holds everything): one process's layout, written by rank 0
    stage0 = sorted(os.listdir(root / "stage0-fp32" / "two" / "global_step3"))
    assert "master.safetensors" in stage0 and not any("rank" in n for n in stage0)


@pytest.mark.parametrize("kind", ["none-bf16", "nvme-int8"])
def test_to_fp32_consolidates_any_world_size(runs, tmp_path, kind):
    from safetensors.torch import load_file
    root, out = runs
    want = _merged(out[2], "saved", kind)
    model = out[2][0][kind]["saved"]["model"]
    for n in ("two", "three"):
        assert main_to_fp32([str(root / kind / n), str(tmp_path / f"{n}.safetensors")]) == 0
        w = load_file(str(tmp_path / f"{n}.safetensors"))
        assert w.keys() == model.keys()
        for k, t in w.items():
            assert t.dtype == torch.float32 and t.shape == model[k].shape
            assert torch.equal(t.reshape(-1), want[k]["master"]), k


# -- failures ---------------------------------------------------------------------------------------
# What the ranks of the failure tests do first: one complete checkpoint "a" at step 1, one more step.
PROLOGUE = """
import json, os, signal, sys, torch
sys.path.insert(0, {here!r})
import ckpt_dp_helpers as h
import zspeed, zspeed.runtime.checkpoint_files as cf
from zspeed.runtime.checkpoint import CheckpointError
zspeed.init_distributed()
rank, root = zspeed.comm.get_rank(), {root!r}
e = h.make({kind!r}, os.path.join(root, "nvme"))
h.train(e, 1)
e.save_checkpoint(root, tag="a")
h.train(e, 1)
"""

FAILURES = PROLOGUE + """
def attempt(what, fn):
    try:
        fn()
        print(json.dumps([what, None]), flush=True)
    except CheckpointError as x:
        print(json.dumps([what, str(x), isinstance(x, AssertionError)]), flush=True)

# a client_state that cannot be stored (rank 0 saves it): refused before anything is written
attempt("client", lambda: e.save_checkpoint(root, tag="b", client_state={{"x": object()}} if rank == 0 else {{}}))
# a rank whose writer raises in the middle of its files
real = cf.StagingWriter.write_tensors
def boom(self, name, tensors, metadata):
    if name.startswith("optim."):
        raise RuntimeError("disk controller on fire")
    return real(self, name, tensors, metadata)
if rank == 1:
    cf.StagingWriter.write_tensors = boom
attempt("write", lambda: e.save_checkpoint(root, tag="b"))
cf.StagingWriter.write_tensors = real
torch.distributed.barrier()
print(json.dumps(["after", sorted(os.listdir(root)), open(os.path.join(root, "latest")).read()]), flush=True)
torch.distributed.barrier()  # both have looked before rank 0's next save creates its staging folder
# different tags on different ranks
attempt("tags", lambda: e.save_checkpoint(root, tag="c" + str(rank)))
# a flipped byte in rank 1's partition file: no rank changes
torch.distributed.barrier()
if rank == 0:
    p = os.path.join(root, "a", "optim.rank1.safetensors")
    data = bytearray(open(p, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(p, "wb").write(bytes(data))
torch.distributed.barrier()
before = h.dump(e)
attempt("differ", lambda: e.load_checkpoint(root, tag="a" if rank == 0 else "nothing"))
attempt("corrupt", lambda: e.load_checkpoint(root, tag="a"))
print(json.dumps(["unchanged", h.same(h.dump(e), before)]), flush=True)
e.close()
"""


def _lines(res) -> dict:
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("["):
            v = json.loads(line)
            out[v[0]] = v[1:]
    return out


def test_failures_during_save_and_load_fail_every_rank_and_change_nothing(tmp_path):
    res = _ranks(2, FAILURES.format(here=str(HERE), root=str(tmp_path), kind="cpu-bf16"))
    got = [_lines(r) for r in res]
    for g in got:
        assert "rank 0" in g["client"][0] and "client_state value at 'client_state.x'" in g["client"][0]
        assert "failed on rank 1 of 2" in g["write"][0] and "RuntimeError: disk controller on fire" in g["write"][0]
        # the previous checkpoint and `latest` are intact, nothing of the failed saves is visible
        assert g["after"] == [[".zspeed-lock", "a", "latest", "nvme", "zero_to_fp32.py", "zero_to_torch.py"], "a"]
        assert "rank 1 asked for tag 'c1', rank 0 for 'c0'" in g["tags"][0]
        assert g["tags"][1] is True  # an AssertionError too, as DeepSpeed's tag_validation "Fail" raises
        assert "rank 1 found no checkpoint" in g["differ"][0] and "Nothing was loaded" in g["differ"][0]
        assert "failed on rank 1 of 2" in g["corrupt"][0] and "optim.rank1.safetensors' is corrupt" in g["corrupt"][0]
        assert g["unchanged"] == [True]
    assert sorted(os.listdir(tmp_path)) == [".zspeed-lock", "a", "latest", "nvme", "zero_to_fp32.py", "zero_to_torch.py"]


KILL = PROLOGUE + """
if rank == {victim}:
    cf._crash_hook = lambda what: os.kill(os.getpid(), signal.SIGKILL) if what == {point!r} else None
try:
    e.save_checkpoint(root, tag="b")
    print("SAVED", flush=True)
except CheckpointError as x:
    print("ERR", x, flush=True)
    # Leave at once: tearing down a process group whose peer is dead waits for it (about
    # 30 s here), which has nothing to do with the checkpoint.
    os._exit(0)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
@pytest.mark.parametrize("victim,point", [(1, "partial optim.rank1.safetensors"), (0, "staging synced"),
                                          (0, "new tag in place")])
def test_a_rank_killed_during_a_save(tmp_path, victim, point):
    """The surviving rank fails with an error (not a hang); a later job sees only complete tags."""
    res = run_ranks(2, KILL.format(here=str(HERE), root=str(tmp_path), kind="nvme-fp32", victim=victim,
                                   point=point),
                    env=_env(DEEPSPEED_TIMEOUT="1"), timeout=240)
    assert res[victim].returncode == -signal.SIGKILL, res[victim]
    survivor = res[1 - victim]
    assert survivor.returncode == 0 and "ERR" in survivor.stdout, survivor
    assert "could not exchange their status" in survivor.stdout and "another rank has most likely stopped" in \
        survivor.stdout.lower()
    committed = point == "new tag in place"
    e = h.make("nvme-fp32", str(tmp_path / "nvme"))
    path, _ = e.load_checkpoint(tmp_path)
    assert path.endswith("a")  # `latest` was not moved yet at any of these points
    tags = sorted(n for n in os.listdir(tmp_path) if not n.startswith(".")
                  and n not in ("latest", "nvme", "zero_to_fp32.py", "zero_to_torch.py"))
    assert tags == (["a", "b"] if committed else ["a"])
    for t in tags:  # every visible tag is complete
        assert e.load_checkpoint(tmp_path, tag=t)[0].endswith(t) and e.global_steps == (1 if t == "a" else 2)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".") and n != ".zspeed-lock"] == []
    e.close()


TENSOR_STEP = r"""
import json, os, sys, torch, zspeed
zspeed.init_distributed()
rank, ws = zspeed.comm.get_rank(), zspeed.comm.get_world_size()
root, phase = json.loads(os.environ["ZS_TSTEP"])

class CountedSGD(torch.optim.SGD):
    '''SGD with momentum whose state also holds a one-element step tensor, as optimizers with
    tensor step counters ("hybrid" state) do.'''
    def step(self, closure=None):
        super().step(closure)
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                st["tensor_step"] = st.get("tensor_step", torch.zeros(1)) + 1

def engine():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(9, 23), torch.nn.Tanh(), torch.nn.Linear(23, 4))
    opt = CountedSGD(m.parameters(), lr=0.05, momentum=0.9)
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
           "zero_allow_untested_optimizer": True}
    return zspeed.initialize(model=m, optimizer=opt, config=cfg)[0]

def train(e, steps, seed):
    g = torch.Generator().manual_seed(seed + rank)
    for _ in range(steps):
        loss = e(torch.randn(2, 9, generator=g)).pow(2).mean()
        e.backward(loss)
        e.step()

e = engine()
if phase == "save":
    train(e, 3, 1)
    e.save_checkpoint(root, tag="t")
    train(e, 2, 2)
else:
    e.load_checkpoint(root, tag="t")
    steps = sorted({float(st["tensor_step"].item()) for st in e.optimizer.state_dict()["state"].values()})
    print("STEPS", steps)
    train(e, 2, 2)
torch.save({k: v.clone() for k, v in e.module.state_dict().items()}, os.path.join(root, f"{phase}.{rank}.pt"))
"""


def test_optimizer_state_with_a_one_element_step_tensor(tmp_path):
    """A client optimizer whose per-parameter state holds a 1-element step tensor beside its
    per-element momentum loads at 2 ranks and continues bit for bit."""
    for phase in ("save", "load"):
        res = run_ranks(2, TENSOR_STEP, env={"ZS_TSTEP": json.dumps([str(tmp_path), phase])}, timeout=240)
        for r in res:
            assert r.returncode == 0, r
    for r in res:
        assert "STEPS [3.0]" in r.stdout, r.stdout
    for rank in range(2):
        a, b = (torch.load(tmp_path / f"{p}.{rank}.pt") for p in ("save", "load"))
        assert all(torch.equal(a[k], b[k]) for k in a)
