"""zspeed's training runtime: DeepSpeed's config, engine, precision, schedules,
offload and checkpoints, on top of torch (>= 2.1) and libzspeed."""


def __getattr__(name):
    """Submodules reached as attributes (``deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES``,
    which accelerate reads after a plain ``import deepspeed``), imported on first use."""
    import importlib
    import importlib.util
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
