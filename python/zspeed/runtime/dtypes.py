"""The model's dtypes under mixed precision: which floating-point buffers are cast and which stay
fp32 (data_types.keep_in_fp32_modules, transformers' _keep_in_fp32_modules lists), the buffers
restored after placement, fp16 auto_cast of a forward's inputs, sparse embedding gradients made
dense, and the hint for a forward that failed on fp32 inputs to a 16-bit model.
"""
from __future__ import annotations

import torch

from .config import _DTYPE_NAMES

__all__ = ["CASTABLE", "cast_inputs", "cast_module", "densify_grad", "dtype_mismatch_hint", "dtype_of", "float_buffers",
           "keep_in_fp32_pattern", "kept_buffers", "restore_buffers", "sparse_grad_params"]


_BUFFER_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# The dtypes a mixed-precision cast touches (DeepSpeed's set: float8 and integer tensors keep theirs).
CASTABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dtype_of(name: str) -> torch.dtype:
    return _BUFFER_DTYPES[_DTYPE_NAMES[name.lower()]]


def float_buffers(module: torch.nn.Module) -> dict:
    """(module, buffer name) -> each castable floating-point buffer as the model was loaded,
    before placement casts the module to the training dtype."""
    return {(id(m), k): b for m in module.modules() for k, b in m.named_buffers(recurse=False, remove_duplicate=False)
            if b is not None and b.dtype in CASTABLE}


def keep_in_fp32_pattern(module: torch.nn.Module, setting, dtype: torch.dtype | None):
    """data_types.keep_in_fp32_modules as one compiled pattern over full buffer names, or None
    (nothing to keep: fp32 training, ``[]``, or "auto" on a model that lists nothing).

    "auto" reads the lists transformers models carry: ``_keep_in_fp32_modules_strict`` (kept under
    bf16 and fp16) and ``_keep_in_fp32_modules`` (under fp16 only), each relative to the module
    that declares it. A pattern's ``*`` stands for any characters; it may match anywhere."""
    import re
    if dtype not in (torch.float16, torch.bfloat16):
        return None
    alts = set()
    if setting is None or setting == "auto":
        for prefix, sub in module.named_modules():
            names = set(getattr(sub, "_keep_in_fp32_modules_strict", None) or ())
            if dtype == torch.float16:
                names |= set(getattr(sub, "_keep_in_fp32_modules", None) or ())
            for n in names:
                body = ".*".join(re.escape(part) for part in str(n).split("*"))
                alts.add(f"^{re.escape(prefix)}\\..*{body}" if prefix else body)
    else:
        alts = {".*".join(re.escape(part) for part in n.split("*")) for n in setting}
    return re.compile("|".join(sorted(alts))) if alts else None


def kept_buffers(module: torch.nn.Module, pattern) -> set:
    """(module, buffer name) of the castable floating-point buffers (CASTABLE, as float_buffers)
    whose full names match ``pattern``."""
    if pattern is None:
        return set()
    return {(id(m), k) for prefix, m in module.named_modules() for k, b in m.named_buffers(recurse=False, remove_duplicate=False)
            if b is not None and b.dtype in CASTABLE and pattern.search(f"{prefix}.{k}" if prefix else k)}


def restore_buffers(module: torch.nn.Module, loaded: dict, dtype: torch.dtype | None, keep: set = frozenset()) -> None:
    """The buffers placement cast, back from their loaded values on the device placement put them
    on: in fp32 for those in ``keep`` (data_types.keep_in_fp32_modules), else in ``dtype``
    (data_types.buffer_dtype), or in the dtype each was loaded in (None; but for BatchNorm's and
    InstanceNorm's running statistics, which torch's kernels need in their weight's dtype)."""
    from torch.nn.modules.batchnorm import _NormBase
    with torch.no_grad():
        for m in module.modules():
            # BatchNorm's and InstanceNorm's kernels need their running statistics in the dtype of
            # their weight: left alone, those follow the training dtype as Module.to casts them.
            norm = isinstance(m, _NormBase) and dtype is None
            for k, b in m.named_buffers(recurse=False, remove_duplicate=False):
                src = loaded.get((id(m), k))
                if src is not None and b is not None and not (norm and (id(m), k) not in keep):
                    want = torch.float32 if (id(m), k) in keep else dtype or src.dtype
                    if b.dtype != want or b.data_ptr() != src.data_ptr():
                        setattr(m, k, src.to(b.device, want))


def cast_module(module: torch.nn.Module, param_dtype, buffer_dtype, is_zero_init_model: bool, keep_pattern) -> None:
    """DeepSpeed's module cast: floating-point parameters to ``param_dtype`` (not ZeRO-Init ones,
    made in it already; None leaves them), buffers to ``buffer_dtype`` (None leaves them), those
    whose full names match ``keep_pattern`` (keep_in_fp32_pattern's) to fp32."""
    keep = kept_buffers(module, keep_pattern)
    with torch.no_grad():
        if param_dtype is not None and not is_zero_init_model:
            for p in module.parameters():
                if p.dtype in CASTABLE and p.dtype != param_dtype:
                    p.data = p.data.to(param_dtype)
        for m in module.modules():
            for k, b in m.named_buffers(recurse=False, remove_duplicate=False):
                if b is None or b.dtype not in CASTABLE:
                    continue
                want = torch.float32 if (id(m), k) in keep else buffer_dtype
                if want is not None and b.dtype != want:
                    b.data = b.data.to(want)


def cast_inputs(obj, dtype):
    if torch.is_tensor(obj):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(cast_inputs(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_inputs(v, dtype) for k, v in obj.items()}
    return obj


def densify_grad(p: torch.Tensor) -> None:
    """A sparse gradient (nn.Embedding / EmbeddingBag built with sparse=True) made dense as it is
    accumulated, before any other hook reads it: every zspeed path reduces and steps dense
    gradients, so the training is that of sparse=False."""
    if p.grad is not None and p.grad.is_sparse:
        p.grad = p.grad.to_dense()


def sparse_grad_params(model: torch.nn.Module) -> list:
    """The parameters of ``model`` whose gradients autograd makes sparse."""
    return [m.weight for m in model.modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse and m.weight.requires_grad]


_DTYPE_ERRORS = ("same dtype", "dtype", "scalar type", "same type", "Input type")


def dtype_mismatch_hint(err: RuntimeError, inputs, kwargs, dtype: torch.dtype) -> str | None:
    """For a forward that failed on mixed dtypes while the script passed fp32 inputs to an
    fp16/bf16 model: a message naming the fix (None when that is not what happened)."""
    text = str(err)
    if not any(k in text for k in _DTYPE_ERRORS):
        return None
    found: list = []

    def walk(o):
        if torch.is_tensor(o):
            if o.is_floating_point() and o.dtype != dtype:
                found.append(o.dtype)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)

    walk(inputs)
    walk(kwargs)
    if not found:
        return None
    name = "fp16" if dtype == torch.float16 else "bf16"
    fix = ("set \"fp16\": {\"enabled\": true, \"auto_cast\": true} in the config, which casts floating-point "
           "inputs to fp16, or cast them yourself (x.half())" if dtype == torch.float16 else
           "cast them yourself (x.to(torch.bfloat16)): DeepSpeed has no auto_cast for bf16")
    return (f"the model runs in {name} (the config enables {name}), but forward() received {found[0]} "
            f"inputs and failed on the mixed dtypes ({text.splitlines()[0]}). DeepSpeed does not cast "
            f"inputs either: {fix}.")
