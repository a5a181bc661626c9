"""engine.zero_grad() drops every gradient the engine holds, at every stage and on every path
(issue 52, finding 1): ``backward(b2); zero_grad(); backward(b3); step()`` trains exactly as
``backward(b3); step()`` (bit for bit: the same kernels in the same order see the same
gradients), as DeepSpeed's zero_grad does at stages 0-3. A loop that skips a bad batch with
zero_grad() must not apply it."""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zspeed  # noqa: E402
import test_zero3 as z3  # noqa: E402

# name -> (stage, optimizer offload, parameter offload, precision, extra offload_optimizer keys,
#          extra offload_param keys)
CASES = {
    "s0-fp32": (0, "none", "none", "fp32", {}, {}),
    "s1-bf16": (1, "none", "none", "bf16", {}, {}),
    "s2-cpu-fp32": (2, "cpu", "none", "fp32", {}, {}),
    "s2-cpu-fp16": (2, "cpu", "none", "fp16", {}, {}),
    "s2-split-bf16": (2, "cpu", "none", "bf16", {"ratio": 0.5}, {}),
    "s2-nvme-fp32": (2, "nvme", "none", "fp32", {}, {}),
    "s3-fp32": (3, "none", "none", "fp32", {}, {}),
    "s3-cpu-bf16": (3, "cpu", "cpu", "bf16", {}, {"grads_in_shards": False}),
    "s3-cpu-bf16-shards": (3, "cpu", "cpu", "bf16", {}, {"grads_in_shards": True}),
    "s3-cpu-fp16-shards": (3, "cpu", "cpu", "fp16", {}, {"grads_in_shards": True}),
    "s3-opt-cpu-fp32": (3, "cpu", "none", "fp32", {}, {}),
    "s3-nvme-bf16-shards": (3, "nvme", "cpu", "bf16", {}, {"grads_in_shards": True}),
    "s3-split-bf16": (3, "cpu", "cpu", "bf16", {"ratio": 0.5}, {}),
    "s3-overlap-bf16": (3, "cpu", "cpu", "bf16", {"overlap_forward": True}, {"grads_in_shards": True}),
}


def _config(case: str, tmp, gas: int = 1) -> dict:
    stage, opt, param, precision, opt_extra, param_extra = CASES[case]
    c = z3._cfg(stage, opt=opt, param=param, precision=precision, gas=gas, tmp=tmp)
    z = c["zero_optimization"]
    if opt_extra:
        z["offload_optimizer"].update(opt_extra)
    if param_extra:
        z["offload_param"].update(param_extra)
    return c


def _engine(case: str, tmp, gas: int = 1):
    tmp.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    return zspeed.initialize(model=z3.Model(), config=_config(case, tmp, gas))[0]


def _backward(e, idx):
    e.backward(z3._loss(e, idx))


def _equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    bad = [k for k in a if not torch.equal(a[k], b[k])]
    assert not bad, f"{what}: {len(bad)} of {len(a)} tensors differ, e.g. {bad[0]} (largest difference " \
                    f"{(a[bad[0]] - b[bad[0]]).abs().max().item():.3g})"


@pytest.mark.parametrize("case", list(CASES))
def test_zero_grad_drops_a_backwards_gradients(case, tmp_path):
    data = z3._data(4, seed=3)
    ref = _engine(case, tmp_path / "ref")
    _backward(ref, data[0])
    ref.step()
    _backward(ref, data[2])
    ref.step()
    want = z3._whole(ref)
    ref.close()

    e = _engine(case, tmp_path / "skip")
    _backward(e, data[0])
    e.step()
    _backward(e, data[1])  # the batch the loop decides to skip
    e.zero_grad()
    _backward(e, data[2])
    e.step()
    assert e.global_steps == 2
    _equal(z3._whole(e), want, f"{case}: zero_grad() between backward and step")
    e.close()


@pytest.mark.parametrize("case", ["s0-fp32", "s2-cpu-fp32", "s3-cpu-bf16", "s3-cpu-bf16-shards", "s3-fp32"])
def test_zero_grad_inside_an_accumulation_drops_its_micro_batches(case, tmp_path):
    """gradient_accumulation_steps 2: a zero_grad() after the first micro-batch drops it; the
    step then applies the micro-batches that came after it (the loss still divided by 2, as
    engine.backward divides each micro-batch's loss by gradient_accumulation_steps)."""
    data = z3._data(4, seed=4)
    ref = _engine(case, tmp_path / "ref", gas=2)
    _backward(ref, data[1])           # micro-batch 1 of the step the other engine keeps
    ref.set_gradient_accumulation_boundary(False)
    ref.step()
    ref.set_gradient_accumulation_boundary(True)
    _backward(ref, data[2])
    ref.step()
    want = z3._whole(ref)
    ref.close()

    e = _engine(case, tmp_path / "skip", gas=2)
    e.set_gradient_accumulation_boundary(False)
    _backward(e, data[0])
    e.zero_grad()                     # drops micro-batch data[0]
    _backward(e, data[1])
    e.step()
    e.set_gradient_accumulation_boundary(True)
    _backward(e, data[2])
    e.step()
    assert e.global_steps == 1
    _equal(z3._whole(e), want, f"{case}: zero_grad() inside an accumulation")
    e.close()
