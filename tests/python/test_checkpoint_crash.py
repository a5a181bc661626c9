"""kill -9 during checkpoint saves, repeated: a fixed tag ('best', replaced on every save) and a
new tag per save. Each round a process resumes from the folder, trains and saves in a loop, and
is killed with SIGKILL, either at one of the points of the save where a crash leaves a different
state on disk (checkpoint_files._crash_hook) or at a random moment. After every kill the folder
must load, hold exactly the state of the step it says, and resume training bit for bit.

To keep rounds cheap the killed processes are forked from one helper process that imported
torch and zspeed once (before any torch computation, so forking is safe); each round's process
is a real process killed by a real SIGKILL."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import zspeed

from engine_helpers import TinyLM, lm_loss, token_data, train


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """CPU-only by design (its helper processes are CPU processes; so are the references): ZSPEED_DEVICE=cpu for each test, also under
    tests/gpu/gate.py (set per test, so that other files' tests keep the GPU)."""
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork and SIGKILL are POSIX")

CONFIG = {"train_batch_size": 4, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05, "torch_adam": True}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 50}},
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
DATA = token_data(16)
SAVES_PER_ROUND = 4
# Large enough (about 12 MiB per checkpoint) that a random moment of the save loop falls inside a
# save more often than not.
VOCAB, WIDTH = 23, 1200

# Points of a save, in order (see checkpoint_files.py); "old tag ..." exist only when a tag is replaced.
# (The optimizer is offloaded: its masters and state are the pieces of a store of one rank.)
POINTS_NEW = ["partial master.rank0.safetensors", "staged master.rank0.safetensors", "partial optim.rank0.safetensors",
              "staged meta.json", "staged manifest.json", "staging synced", "new tag in place",
              "temporary latest written", "latest replaced"]
POINTS_FIXED = POINTS_NEW[:6] + ["old tag moved aside"] + POINTS_NEW[6:] + ["old tag removed"]

HELPER = textwrap.dedent("""
    import json, os, signal, sys, threading
    sys.path.insert(0, {tests!r})
    os.environ["ZSPEED_DEVICE"] = "cpu"
    import torch, zspeed
    import zspeed.runtime.checkpoint_files as cf
    from engine_helpers import TinyLM, lm_loss, token_data, train
    CONFIG, DATA = json.loads({config!r}), token_data(16)
    VOCAB, WIDTH = {vocab}, {width}

    def scenario(folder, fixed, point, occurrence, delay):
        def die():
            os.kill(os.getpid(), signal.SIGKILL)
        if point != "time":
            seen = [0]
            def hook(what):
                if what == point:
                    seen[0] += 1
                    if seen[0] == occurrence:
                        die()
            cf._crash_hook = hook
        e, *_ = zspeed.initialize(model=TinyLM(VOCAB, WIDTH), config=CONFIG)
        e.load_checkpoint(folder)
        print("START", e.global_steps, flush=True)
        if point == "time":  # a random moment of the save loop
            threading.Timer(delay, die).start()
        for _ in range({saves}):
            train(e, DATA, 1, start=e.global_steps, loss=lm_loss)
            e.save_checkpoint(folder, tag="best" if fixed else None)
            print("SAVED", e.global_steps, flush=True)

    print("READY", flush=True)
    for line in sys.stdin:
        folder, fixed, point, occurrence, delay = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                scenario(folder, fixed, point, occurrence, delay)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("EXIT", status, flush=True)
""")


class Helper:
    def __init__(self):
        code = HELPER.format(tests=str(Path(__file__).parent), config=json.dumps(CONFIG), saves=SAVES_PER_ROUND,
                             vocab=VOCAB, width=WIDTH)
        root = str(Path(zspeed.__file__).parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        self.p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        assert self.readline() == "READY", self.p.stderr.read()

    def readline(self) -> str:
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f"helper died: {self.p.stderr.read()}")
        return line.strip()

    def round(self, folder, fixed, point, occurrence=1, delay=0.0) -> tuple:
        """Runs one killed process; returns (its exit status, the steps it saved)."""
        self.p.stdin.write(json.dumps([str(folder), fixed, point, occurrence, delay]) + "\n")
        self.p.stdin.flush()
        saved = []
        while True:
            line = self.readline()
            if line.startswith("SAVED"):
                saved.append(int(line.split()[1]))
            elif line.startswith("EXIT"):
                return int(line.split()[1]), saved

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


@pytest.fixture(scope="module")
def helper():
    h = Helper()
    yield h
    h.close()


class Reference:
    """The state after every step of one uninterrupted run (the resumed runs must match it)."""

    def __init__(self):
        self.engine, *_ = zspeed.initialize(model=TinyLM(VOCAB, WIDTH), config=CONFIG)
        self.states = [self._state()]

    def _state(self):
        e = self.engine
        return ({k: v.clone() for k, v in e.module.state_dict().items()},
                {k: v.clone() for k, v in e._master_named().items()}, e.get_lr())

    def at(self, step: int):
        while len(self.states) <= step:
            train(self.engine, DATA, 1, start=self.engine.global_steps, loss=lm_loss)
            self.states.append(self._state())
        return self.states[step]


@pytest.fixture(scope="module")
def reference():
    return Reference()


def _matches(e, state) -> bool:
    model, masters, lr = state
    got = e._master_named()
    return (all(torch.equal(v, model[k]) for k, v in e.module.state_dict().items()) and
            all(torch.equal(v, masters[k]) for k, v in got.items()) and e.get_lr() == lr)


def _check_folder(d: Path, fixed: bool, confirmed: int, reference: Reference) -> int:
    """The folder after a kill: loads, holds the step it names, resumes exactly. Returns that step."""
    e, *_ = zspeed.initialize(model=TinyLM(VOCAB, WIDTH), config=CONFIG)
    path, _ = e.load_checkpoint(d)
    if confirmed == 0 and path is None:
        return 0  # killed before the first save completed: nothing to load, which is correct
    assert path is not None
    g = e.global_steps
    # A save that completed is never lost; a save killed after its commit may also be there.
    assert confirmed <= g <= confirmed + 1, (confirmed, g)
    assert _matches(e, reference.at(g)), g
    train(e, DATA, 1, start=g, loss=lm_loss)  # and the run continues as if never interrupted
    assert _matches(e, reference.at(g + 1)), g + 1
    # Every visible tag is complete (no torn folder is ever visible), and no leftovers stay.
    tags = [n for n in os.listdir(d) if not n.startswith(".") and n not in ("latest", "zero_to_fp32.py", "zero_to_torch.py")]
    assert tags == ["best"] if fixed else len(tags) >= 1
    for t in tags:
        f, *_ = zspeed.initialize(model=TinyLM(VOCAB, WIDTH), config=CONFIG)
        f.load_checkpoint(d, tag=t)
        assert _matches(f, reference.at(f.global_steps)), t
    assert [n for n in os.listdir(d) if n.startswith(".") and n != ".zspeed-lock"] == []
    return g


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-tag", "new-tag"])
def test_kill_at_every_point_of_a_save(tmp_path, helper, reference, fixed):
    d = tmp_path / "ck"
    confirmed = 0
    for point in POINTS_FIXED if fixed else POINTS_NEW:
        # The second save of the round: with a fixed tag, that one replaces an existing tag.
        status, saved = helper.round(d, fixed, point, occurrence=2)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (point, status)
        confirmed = max([confirmed] + saved)
        assert len(saved) == 1, (point, saved)
        confirmed = _check_folder(d, fixed, confirmed, reference)


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-tag", "new-tag"])
def test_kill_at_random_moments(tmp_path, helper, reference, fixed):
    rng = random.Random(1234 + fixed)
    d = tmp_path / "ck"
    confirmed = 0
    rounds = int(os.environ.get("ZSPEED_CRASH_ROUNDS", "8"))
    for r in range(rounds):
        # Half the rounds at a random point of a random save, half at a random time.
        if r % 2:
            points = POINTS_FIXED if fixed else POINTS_NEW
            status, saved = helper.round(d, fixed, rng.choice(points), occurrence=rng.randint(1, SAVES_PER_ROUND))
        else:
            status, saved = helper.round(d, fixed, "time", delay=rng.uniform(0.0, 0.5))
        confirmed = max([confirmed] + saved)
        confirmed = _check_folder(d, fixed, confirmed, reference)
