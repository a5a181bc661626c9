"""What zspeed needs that is not always installed, and how to say so (imported by the
package and by zspeed.ops, below both)."""
from __future__ import annotations

__all__ = ["require_torch"]

# What to run when torch is missing. zspeed is installed from a checkout (it is not on the
# package index), so the extra is spelled for a checkout; torch itself comes from the index,
# where PyTorch's own index serves the small CPU-only build.
_TORCH_INSTALL_HINT = ("pip install torch (for the smaller CPU-only build: "
                      "pip install torch --index-url https://download.pytorch.org/whl/cpu); "
                      "from a zspeed checkout, pip install '.[torch]' installs zspeed with torch")


def require_torch(what: str = "zspeed's training runtime") -> None:
    """The training runtime needs torch; say which package and how to get it."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{what} needs PyTorch (any version >= 2.1), which is not "
                          f"installed ({e}): {_TORCH_INSTALL_HINT}.") from None
