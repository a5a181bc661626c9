"""ZSPEED_AS_DEEPSPEED (python/zspeed/_as_deepspeed.py and the wheel's zspeed_as_deepspeed.pth):
zspeed stands in for deepspeed in every process of an environment when asked, never silently
over an installed DeepSpeed, and the variable unset changes nothing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import zspeed

ROOT = Path(__file__).resolve().parents[2]
PTH = ROOT / "python" / "zspeed_as_deepspeed.pth"
PKG_PARENT = str(Path(zspeed.__file__).resolve().parent.parent)

PROBE = r'''
import site, sys
site.addsitedir(sys.argv[1])
try:
    import deepspeed
    import importlib.metadata as md
    try:
        v = md.version("deepspeed")
    except md.PackageNotFoundError:
        v = None
    print("DS", deepspeed.__name__, v)
except ImportError as e:
    print("NO", type(e).__name__)
'''


def _run(tmp_path, value=None, extra_path=(), probe=PROBE, args=(), cwd=None, check=True):
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(PTH, site_dir / PTH.name)
    env = {k: v for k, v in os.environ.items() if k != "ZSPEED_AS_DEEPSPEED"}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), PKG_PARENT])
    if value is not None:
        env["ZSPEED_AS_DEEPSPEED"] = value
    r = subprocess.run([sys.executable, "-c", probe, str(site_dir), *args], capture_output=True, text=True, env=env,
                       timeout=120, cwd=cwd)
    if not check:
        return r
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1], r.stderr


@pytest.fixture(autouse=True)
def _no_real_deepspeed():
    import importlib.util
    if importlib.util.find_spec("deepspeed") is not None and not zspeed.hf.installed():
        pytest.skip("a real DeepSpeed is installed in this environment")


def test_the_variable_makes_deepspeed_zspeed_and_unset_changes_nothing(tmp_path):
    from zspeed.hf import DEEPSPEED_API_VERSION
    out, err = _run(tmp_path, "1")
    assert out == f"DS zspeed {DEEPSPEED_API_VERSION}", (out, err)
    for value in (None, "", "0"):
        out, err = _run(tmp_path, value)
        assert out == "NO ModuleNotFoundError" and err == "", (value, out, err)
    out, err = _run(tmp_path, "yes")
    assert out == "NO ModuleNotFoundError" and "'yes' is not one of 1, force, 0" in err


def test_an_installed_deepspeed_is_not_shadowed_unless_forced(tmp_path):
    fake = tmp_path / "real"
    (fake / "deepspeed").mkdir(parents=True)
    (fake / "deepspeed" / "__init__.py").write_text("")
    out, err = _run(tmp_path, "1", extra_path=[fake])
    assert out.startswith("DS deepspeed") and "ZSPEED_AS_DEEPSPEED=1 is ignored: DeepSpeed is installed here" in err
    out, err = _run(tmp_path, "force", extra_path=[fake])
    assert out.startswith("DS zspeed"), (out, err)


def test_the_wheel_installs_the_hook():
    wheel = os.environ.get("ZSPEED_WHEEL")
    if not wheel:
        pytest.skip("ZSPEED_WHEEL not set (make test-python sets it)")
    with zipfile.ZipFile(wheel) as z:
        assert "zspeed_as_deepspeed.pth" in z.namelist() and "zspeed/_as_deepspeed.py" in z.namelist()
    # Installed (make test installs the wheel into the environment that runs this): a plain child.
    env = dict(os.environ, ZSPEED_AS_DEEPSPEED="1")
    r = subprocess.run([sys.executable, "-c", "import deepspeed; print(deepspeed.__name__)"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "zspeed", r.stderr


ACCELERATE_SCRIPT = r'''
import torch
from accelerate import Accelerator
import deepspeed
acc = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(32, 6, generator=g), torch.randn(32, 2, generator=g))
model, opt, dl = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=4))
losses = []
for x, y in dl:
    loss = torch.nn.functional.mse_loss(model(x), y)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
print("TRAINED", deepspeed.__name__, type(model).__name__, model.zero_optimization_stage(), losses[-1] < losses[0])
'''


def test_accelerate_launch_use_deepspeed_runs_on_zspeed(tmp_path):
    """``accelerate launch --use_deepspeed`` (what the variable is for): the launcher imports
    deepspeed.launcher.runner, starts the worker through torchrun, and the worker trains with
    zspeed's engine at the ZeRO stage the command line gave. The hook is the wheel's .pth, made
    active in every process (launcher and worker) through a sitecustomize."""
    pytest.importorskip("accelerate", reason="accelerate is not installed (requirements-dev.txt has it)")
    pytest.importorskip("torch")
    import socket
    try:  # accelerate's launcher checks its port on "localhost" before it starts anything
        socket.getaddrinfo("localhost", None)
    except OSError as e:
        pytest.skip(f"this machine does not resolve 'localhost' ({e}; no /etc/hosts entry), which accelerate's "
                    f"launcher needs")
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    shutil.copy(PTH, site_dir / PTH.name)
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site_dir)!r})\n")
    (tmp_path / "train.py").write_text(ACCELERATE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(ZSPEED_AS_DEEPSPEED="1", ZSPEED_DEVICE="cpu", PYTHONPATH=os.pathsep.join([str(boot), PKG_PARENT]))
    r = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--zero_stage", "2",
                        "--offload_optimizer_device", "cpu", "--num_processes", "1", "--num_machines", "1",
                        "--mixed_precision", "no", "--dynamo_backend", "no", "--gradient_accumulation_steps", "1",
                        str(tmp_path / "train.py")], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TRAINED zspeed ZSpeedEngine 2 True" in r.stdout, (r.stdout, r.stderr[-2000:])
    from zspeed.launcher import runner
    assert runner.DEEPSPEED_ENVIRONMENT_NAME == os.environ.get("DS_ENV_FILE", ".deepspeed_env")


PIP = r'''
import runpy, site, sys
site.addsitedir(sys.argv[1])   # the wheel's .pth, as at start-up
sys.argv = ["pip", *sys.argv[2:]]
runpy.run_module("pip", run_name="__main__")
'''


def test_pip_does_not_see_the_stand_in(tmp_path):
    """pip in an environment with the variable set: DeepSpeed is not reported installed (pip
    list / freeze / show), so ``pip install deepspeed`` would install it and a requirements
    file made with ``pip freeze`` does not name it."""
    pytest.importorskip("pip")
    r = _run(tmp_path, "1", probe=PIP, args=["list", "--format=freeze", "--disable-pip-version-check"],
             check=False)
    assert r.returncode == 0, r.stderr
    assert "zspeed" in r.stdout.lower() or "numpy" in r.stdout.lower()  # (it listed the environment)
    assert not any(line.lower().startswith("deepspeed==") for line in r.stdout.splitlines()), r.stdout
    r = _run(tmp_path, "1", probe=PIP, args=["show", "deepspeed", "--disable-pip-version-check"], check=False)
    assert r.returncode != 0 and "not found" in (r.stdout + r.stderr).lower(), (r.stdout, r.stderr)


def test_a_scripts_own_deepspeed_module_is_not_shadowed(tmp_path):
    """A ``deepspeed.py`` in the script's folder (the working directory for -c) is what
    ``import deepspeed`` finds, as Python's import rule says, with the variable set too."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "deepspeed.py").write_text("MINE = True\n")
    probe = PROBE.replace('print("DS", deepspeed.__name__, v)', 'print("DS", deepspeed.__name__, getattr(deepspeed, "MINE", False))')
    out, err = _run(tmp_path, "1", probe=probe, cwd=work)
    assert out == "DS deepspeed True", (out, err)
    (work / "deepspeed.py").unlink()
    out, err = _run(tmp_path, "1", probe=probe, cwd=work)
    assert out == "DS zspeed False", (out, err)
