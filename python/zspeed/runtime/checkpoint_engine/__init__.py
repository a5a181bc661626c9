"""DeepSpeed's ``deepspeed.runtime.checkpoint_engine``: the interface scripts and libraries use
to write and read extra files next to a checkpoint (``engine.checkpoint_engine``), with the
torch.save / torch.load engine. zspeed's own checkpoints do not go through it (they are
safetensors transactions, docs/CHECKPOINTS.md); DeepSpeed's other engines (Nebula, fast,
decoupled, DataStates writers) are refused by name."""
from .checkpoint_engine import CheckpointCommitInfo, CheckpointEngine
from .torch_checkpoint_engine import TorchCheckpointEngine
from .utils import create_checkpoint_engine

__all__ = ["CheckpointCommitInfo", "CheckpointEngine", "TorchCheckpointEngine", "create_checkpoint_engine"]

_OTHERS = ("FastCheckpointEngine", "DecoupledCheckpointEngine", "DataStatesCheckpointEngine",
           "NebulaCheckpointEngine")


def __getattr__(name):
    if name in _OTHERS:
        raise ImportError(f"zspeed has no {name}: DeepSpeed's alternative checkpoint writers are not part of "
                          f"zspeed; use TorchCheckpointEngine for files of your own, and engine.save_checkpoint "
                          f"(safetensors, written as one transaction) for the training state.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
