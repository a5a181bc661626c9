"""DeepSpeed's ``deepspeed.git_version_info``: what this install is and what it runs on.

``version``, ``git_hash`` and ``git_branch`` (``"[none]"`` where a release is not tied to a git
checkout, DeepSpeed's spelling for that), ``installed_ops`` and ``compatible_ops`` (op name ->
whether it works here: zspeed's ops are prebuilt in libzspeed or plain torch, so an op is
installed exactly when it is compatible), ``accelerator_name`` and ``torch_info`` (torch's
``version``, ``cuda_version``, ``nccl_version`` and ``hip_version`` as "major.minor", ``"0.0"``
where absent, and ``bf16_support``), which test suites and environment reports read.

Everything but the version strings is computed on first access, so importing this module
imports neither torch nor libzspeed.
"""
from __future__ import annotations

from ._version import __git_branch__, __git_hash__, __version__

__all__ = ["version", "git_hash", "git_branch", "installed_ops", "compatible_ops", "accelerator_name",
           "torch_info"]

version = __version__
git_hash = __git_hash__ or "[none]"
git_branch = __git_branch__ or "[none]"

_cache: dict = {}


def _major_minor(text) -> str:
    return ".".join(str(text).split(".")[:2]) if text else "0.0"


def _torch_info() -> dict:
    import torch
    info = {"version": _major_minor(torch.__version__.split("+")[0]), "bf16_support": False,
            "cuda_version": _major_minor(torch.version.cuda), "nccl_version": "0.0",
            "hip_version": _major_minor(getattr(torch.version, "hip", None))}
    if torch.version.cuda is not None:
        try:
            nccl = torch.cuda.nccl.version()
            info["nccl_version"] = ".".join(map(str, nccl[:2])) if isinstance(nccl, tuple) else "0.0"
        except Exception:  # built without NCCL (Windows wheels): DeepSpeed reports 0.0 there too
            pass
        info["bf16_support"] = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return info


def _compute(name: str):
    if name in ("installed_ops", "compatible_ops"):
        from .ops.op_builder import compatible_ops as ops
        return ops()
    if name == "accelerator_name":
        from .accelerator import get_accelerator
        return get_accelerator()._name
    return _torch_info()


def __getattr__(name):
    if name in ("installed_ops", "compatible_ops", "accelerator_name", "torch_info"):
        if name not in _cache:
            _cache[name] = _compute(name)
        return dict(_cache[name]) if isinstance(_cache[name], dict) else _cache[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
