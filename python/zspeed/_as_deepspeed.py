"""``ZSPEED_AS_DEEPSPEED=1``: zspeed as ``deepspeed`` in every Python process of an environment.

:func:`zspeed.hf.install` acts in the process that calls it. Launchers start other processes
that look for DeepSpeed themselves (``accelerate launch --use_deepspeed`` checks the installed
"deepspeed" distribution before it starts the workers; ``torchrun`` workers import it); for
them the wheel installs ``zspeed_as_deepspeed.pth`` into site-packages, whose one line imports
this module at interpreter start-up only when the variable is set (otherwise it costs one
environment lookup and imports nothing of zspeed).

- ``ZSPEED_AS_DEEPSPEED=1``: install() in this process, unless a real DeepSpeed is installed in
  the environment: then nothing changes and one line on stderr says so (zspeed never shadows
  an installed DeepSpeed silently);
- ``ZSPEED_AS_DEEPSPEED=force``: install() even then (zspeed shadows it in that process);
- unset, empty or ``0``: nothing. Any other value: nothing, and a line on stderr naming the
  values.

The variable is inherited by child processes, so ``ZSPEED_AS_DEEPSPEED=1 accelerate launch
--use_deepspeed ...`` reaches the launcher and every worker. A failure here never stops the
interpreter: it is reported on stderr and ignored.
"""
from __future__ import annotations

import os
import sys

VAR = "ZSPEED_AS_DEEPSPEED"


def _real_deepspeed() -> str | None:
    """Where an installed DeepSpeed is (its module or its distribution), None if there is none."""
    import importlib.metadata
    import importlib.util
    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and not (spec.name or "").startswith("zspeed"):
        return spec.origin or "an importable 'deepspeed' package"
    try:
        dist = importlib.metadata.distribution("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None
    return f"the distribution deepspeed {dist.version}"


def activate() -> bool:
    """Applies the variable (see the module docstring); True when zspeed now stands in."""
    mode = os.environ.get(VAR, "").strip().lower()
    if mode in ("", "0"):
        return False
    if mode not in ("1", "force"):
        sys.stderr.write(f"zspeed: {VAR}={os.environ.get(VAR)!r} is not one of 1, force, 0; ignored.\n")
        return False
    real = _real_deepspeed()
    if real is not None and mode != "force":
        sys.stderr.write(f"zspeed: {VAR}=1 is ignored: DeepSpeed is installed here ({real}). Uninstall it, set "
                         f"{VAR}=force to use zspeed as deepspeed anyway, or unset {VAR}.\n")
        return False
    from . import hf
    hf.install()
    return True


try:
    activate()
except Exception as e:  # noqa: BLE001 - interpreter start-up must go on
    sys.stderr.write(f"zspeed: {VAR} could not be applied ({type(e).__name__}: {e}); deepspeed is not zspeed "
                     f"in this process.\n")
