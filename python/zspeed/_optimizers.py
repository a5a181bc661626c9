"""The optimizers zspeed runs, in one table.

One :class:`Algorithm` per optimizer type a config may name: its libzspeed kernel, the
per-element state it keeps (in the kernel's two state slots), whether its state counts steps,
and the class names its state is recorded under in checkpoints. The config's type names and
messages, the memory model, the checkpoint checks, the NVMe tier's state keys and ZeRO's list
of tested client classes all read this table. A new optimizer also needs its C kernel, its
swapper kind, its parameters' schema and its constructors: docs/ARCHITECTURE.md lists the files.

Plain data: imports neither torch nor libzspeed.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Algorithm", "ALGORITHMS", "by_type", "listed", "checkpoint_classes", "ZERO_TESTED_CLASSES"]


@dataclass(frozen=True)
class Algorithm:
    name: str                            # the config's type, as zspeed spells it ("AdamW")
    kernel: str                          # libzspeed's step kernel and the NVMe swapper's kind
    slots: tuple[str | None, str | None]  # state keys in the kernel's first and second slot
    steps: bool                          # its state holds a step counter (bias correction)
    cpu_class: str                       # zspeed's CPU class, as checkpoints record it
    device_class: str                    # the class the device path runs, as checkpoints record it

    @property
    def states(self) -> tuple[str, ...]:
        """Per-element state keys, in torch's names ("exp_avg", "exp_avg_sq", "sum")."""
        return tuple(k for k in self.slots if k)


_ADAM_SLOTS = ("exp_avg", "exp_avg_sq")
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("Adam", "adam", _ADAM_SLOTS, True, "CPUAdam", "Adam"),
    Algorithm("AdamW", "adam", _ADAM_SLOTS, True, "CPUAdam", "AdamW"),
    Algorithm("Adagrad", "adagrad", (None, "sum"), True, "CPUAdagrad", "Adagrad"),
    Algorithm("Lion", "lion", ("exp_avg", None), False, "CPULion", "TorchLion"),
)}


def by_type(type_name: str) -> Algorithm | None:
    """The algorithm a config's ``optimizer.type`` names (any letter case), None if none."""
    low = str(type_name).lower()
    return next((a for a in ALGORITHMS.values() if a.name.lower() == low), None)


def listed(last: str = "and") -> str:
    """The types a config may name, for messages: "Adam, AdamW, Adagrad and Lion"."""
    names = list(ALGORITHMS)
    return f"{', '.join(names[:-1])} {last} {names[-1]}"


def checkpoint_classes() -> dict[str, tuple[tuple[str, ...], str | None]]:
    """Class name recorded in a checkpoint -> (per-element state keys, kind of its "step": "int"
    for zspeed's CPU classes, "tensor" for torch's, None where the state has no step)."""
    out: dict[str, tuple[tuple[str, ...], str | None]] = {}
    for a in ALGORITHMS.values():
        out[a.cpu_class] = (a.states, "int" if a.steps else None)
        out[a.device_class] = (a.states, "tensor" if a.steps else None)
    return out


# The client optimizer classes ZeRO (stage 1 and up) takes without zero_allow_untested_optimizer,
# as (module, class name): DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS (torch's Adam, AdamW and
# Adagrad, FusedAdam, FusedLion and the DeepSpeedCPU* classes) and zspeed's CPU classes they
# derive from. The exact class counts, as in DeepSpeed (a subclass is not tested).
ZERO_TESTED_CLASSES: tuple[tuple[str, str], ...] = (
    ("torch.optim", "Adam"), ("torch.optim", "AdamW"), ("torch.optim", "Adagrad"),
    ("zspeed.ops._torch_optim", "CPUAdam"), ("zspeed.ops._torch_optim", "CPUAdagrad"),
    ("zspeed.ops._torch_optim", "CPULion"), ("zspeed.ops._ds_optim", "DeepSpeedCPUAdam"),
    ("zspeed.ops._ds_optim", "DeepSpeedCPUAdagrad"), ("zspeed.ops._ds_optim", "DeepSpeedCPULion"),
    ("zspeed.ops._ds_optim", "FusedAdam"), ("zspeed.ops._ds_optim", "FusedLion"),
)
