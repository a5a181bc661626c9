"""zspeed: DeepSpeed's memory-saving training machinery (ZeRO-Offload of
optimizer state to CPU memory and NVMe, async I/O, SIMD CPU optimizers) as a
portable C11 library with a thin pure-Python front end.

``import zspeed as deepspeed`` works for training scripts: ``initialize``,
``add_config_arguments`` and ``init_distributed`` are here. The runtime needs
torch; it is imported only when first used, so ``import zspeed`` does not."""
from ._version import __version__
from ._native import NativeError, ZSpeedError

__all__ = ["__version__", "ZSpeedError", "NativeError", "initialize", "add_config_arguments",
           "init_distributed", "ConfigError", "ZSpeedEngine", "DeepSpeedEngine"]


def _require_torch() -> None:
    """The training runtime needs torch; say which package and how to get it."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ImportError(f"zspeed's training runtime needs PyTorch (any version >= 2.1), which is not "
                          f"installed ({e}): pip install torch (or pip install zspeed[torch]).") from None


def initialize(*args, **kwargs):
    """DeepSpeed's initialize(): returns (engine, optimizer, dataloader, lr_scheduler).

    See zspeed.runtime.engine.initialize for the arguments."""
    _require_torch()
    from .runtime.engine import initialize as _initialize
    return _initialize(*args, **kwargs)


def add_config_arguments(parser):
    """Adds DeepSpeed's --deepspeed / --deepspeed_config arguments to an argparse parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations (zspeed)")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="enable the DeepSpeed engine (accepted for compatibility)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed JSON config file")
    return parser


def init_distributed(*args, **kwargs):
    """DeepSpeed's init_distributed(). zspeed trains in one process for now: this checks
    that no multi-process launch was requested and otherwise does nothing."""
    del args, kwargs
    from .runtime.config import ConfigError, world_size_from_env
    ws = world_size_from_env()
    if ws > 1:
        raise ConfigError(f"world size is {ws}, but zspeed trains in one process for now "
                          f"(multi-rank ZeRO comes in a later release).")


def __getattr__(name):
    if name == "ConfigError":
        from .runtime.config import ConfigError
        return ConfigError
    if name in ("ZSpeedEngine", "DeepSpeedEngine"):
        _require_torch()
        from .runtime.engine import ZSpeedEngine
        return ZSpeedEngine
    raise AttributeError(f"module 'zspeed' has no attribute {name!r}")
