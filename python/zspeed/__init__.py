"""zspeed: DeepSpeed's memory-saving training machinery (ZeRO-Offload of
optimizer state to CPU memory and NVMe, async I/O, SIMD CPU optimizers) as a
portable C11 library with a thin pure-Python front end.

``import zspeed as deepspeed`` works for training scripts: ``initialize``,
``add_config_arguments`` and ``init_distributed`` are here, and so are the
submodules scripts reach through the package (``comm``, ``accelerator``, ``utils``,
``ops``, ``zero``, ``pipe``, ``moe``, ``checkpoint``, ``runtime``). The runtime needs
torch; it is imported only when first used, so ``import zspeed`` does not.

Version attributes follow DeepSpeed's: ``__version__``, ``__version_major__``,
``__version_minor__``, ``__version_patch__``, ``version``, ``__git_hash__`` and
``__git_branch__`` (None: a release is not tied to a git checkout)."""
from ._version import __git_branch__, __git_hash__, __version__
from ._native import NativeError, ZSpeedError
from ._user_errors import install as _install_error_hook

_install_error_hook()  # a zspeed error that ends the program prints its message, not a traceback

__all__ = ["__version__", "ZSpeedError", "NativeError", "initialize", "add_config_arguments",
           "init_distributed", "init_inference", "ConfigError", "DeepSpeedConfigError", "ZSpeedEngine", "DeepSpeedEngine", "get_accelerator"]

version = __version__
__version_major__, __version_minor__, __version_patch__ = (int(x) for x in __version__.split(".")[:3])


from ._requires import _TORCH_INSTALL_HINT, require_torch as _require_torch  # noqa: E402,F401


def initialize(*args, **kwargs):
    """DeepSpeed's initialize(): returns (engine, optimizer, dataloader, lr_scheduler).

    See zspeed.runtime.engine.initialize for the arguments."""
    _require_torch()
    from .runtime.engine import initialize as _initialize
    return _initialize(*args, **kwargs)


def init_inference(model, config=None, **kwargs):
    """DeepSpeed's init_inference(): the model ready for inference, its weights streamed from
    host memory with ``"zero": {"stage": 3, "offload_param": {"device": "cpu"}}`` (see
    zspeed.inference)."""
    _require_torch()
    from .inference import init_inference as _init
    return _init(model, config, **kwargs)


def add_config_arguments(parser):
    """Adds DeepSpeed's --deepspeed / --deepspeed_config arguments to an argparse parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations (zspeed)")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="enable the DeepSpeed engine (accepted for compatibility)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed JSON config file")
    return parser


def init_distributed(*args, **kwargs):
    """DeepSpeed's init_distributed(): creates or adopts the torch.distributed process group
    (see zspeed.comm.init_distributed)."""
    _require_torch()
    from .comm import init_distributed as _init
    return _init(*args, **kwargs)


# Submodules that DeepSpeed scripts reach as attributes (deepspeed.comm.get_rank(), ...);
# imported on first use because they need torch.
_TORCH_SUBMODULES = ("comm", "accelerator", "checkpointing")
# Submodules that import without torch, also imported on first use.
_PLAIN_SUBMODULES = ("utils", "ops", "pipe", "moe", "checkpoint", "runtime")


def __getattr__(name):
    if name in ("ConfigError", "DeepSpeedConfigError"):  # the latter: DeepSpeed's name of its config error
        from .runtime.config import ConfigError
        return ConfigError
    if name in _TORCH_SUBMODULES:
        _require_torch()
        import importlib
        return importlib.import_module("." + name, __name__)
    if name in _PLAIN_SUBMODULES:
        import importlib
        return importlib.import_module("." + name, __name__)
    if name == "zero":  # deepspeed.zero is deepspeed.runtime.zero
        from .runtime import zero
        return zero
    if name == "get_accelerator":
        _require_torch()
        from .accelerator import get_accelerator
        return get_accelerator
    if name in ("ZSpeedEngine", "DeepSpeedEngine"):
        _require_torch()
        from .runtime.engine import ZSpeedEngine
        return ZSpeedEngine
    raise AttributeError(f"module 'zspeed' has no attribute {name!r}")
