"""DeepSpeed's ``deepspeed.runtime.zero.stage_1_and_2``: the class of ``engine.optimizer`` at ZeRO
stages 1 and 2, and DeepSpeed's estimators of the memory ZeRO-2 needs.

:class:`DeepSpeedZeroOptimizer` is what ``engine.optimizer`` is at stages 1-2, so that a script's
``isinstance(engine.optimizer, DeepSpeedZeroOptimizer)`` holds as with DeepSpeed; it is the
engine's optimizer wrapper (runtime/engine_optimizer.py: ``.optimizer`` is the basic optimizer,
``.loss_scaler``, ``.cur_scale`` and the rest as DeepSpeed's), built by ``initialize``, not by
scripts.

The estimators give DeepSpeed's numbers (its formulas, for DeepSpeed's layout of a run: what a
script that calls them expects). zspeed's own footprint is smaller (docs/ZERO3.md, "Host memory,
disk and GPU memory"); ``zspeed plan`` gives it for a model and a machine.
"""
from __future__ import annotations

from ..engine_optimizer import EngineOptimizer

__all__ = ["DeepSpeedZeroOptimizer", "estimate_zero2_model_states_mem_needs",
           "estimate_zero2_model_states_mem_needs_all_live", "estimate_zero2_model_states_mem_needs_all_cold",
           "model_to_params"]


class DeepSpeedZeroOptimizer(EngineOptimizer):
    """``engine.optimizer`` at ZeRO stages 1 and 2 (see the module docstring)."""

    @property
    def single_partition_of_fp32_groups(self) -> list:
        """DeepSpeed's name for the fp32 masters, read by checkpoint checks: copies, taken when read, of the fp32 master weights this rank holds
        per parameter group, flat (zspeed's partitioning, so the layout is zspeed's, not DeepSpeed's;
        writing into them does not change the masters: use the tensor-fragment API for that)."""
        return self._fp32_flat()


def model_to_params(model) -> int:
    """The model's parameter count, a tensor shared by several parameters counted once."""
    return sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())


def estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=True,
                                          additional_buffer_factor=1.5) -> tuple[int, int]:
    """(bytes per CPU, bytes per GPU) that DeepSpeed's ZeRO-2 needs for the parameters, the
    gradients and the optimizer state (its formula: with CPU offload, the 16-bit parameters on each
    GPU and max(4 x GPUs, 16) bytes per parameter on the host; without, 2 bytes per parameter plus
    18 per parameter divided over the GPUs, and 4 bytes per parameter per GPU of the node on the
    host), host figures times ``additional_buffer_factor``."""
    gpus = num_nodes * num_gpus_per_node
    cpu, gpu = _ZERO2[bool(cpu_offload)](total_params, gpus, num_gpus_per_node, additional_buffer_factor)
    return int(cpu), int(gpu)


# offload_optimizer cpu or not -> (bytes per CPU, bytes per GPU)(params, GPUs, GPUs per node, buffer factor)
_ZERO2 = {True: lambda n, gpus, per_node, f: (n * max(4 * gpus, 16) * f, 2 * n),
          False: lambda n, gpus, per_node, f: (n * 4 * per_node * f, 2 * n + int(18 * n / gpus))}
_DEVICE = {True: "cpu", False: "none"}


def estimate_zero2_model_states_mem_needs_all_cold(total_params, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5) -> None:
    """Prints :func:`estimate_zero2_model_states_mem_needs` with and without CPU offload for a
    model of ``total_params`` parameters."""
    print(f"DeepSpeed's estimate of the memory ZeRO-2 needs for parameters, gradients and optimizer state:\n"
          f"  {num_nodes} node(s) x {num_gpus_per_node} GPU(s), {int(total_params / 1e6)}M parameters\n"
          f"  per CPU  |  per GPU | options")
    for offload in (True, False):
        cpu, gpu = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node, num_nodes, offload,
                                                         additional_buffer_factor)
        print(f"  {cpu / 2**30:7.2f}GB | {gpu / 2**30:6.2f}GB | offload_optimizer={_DEVICE[offload]}")
    print("  (zspeed's own footprint is smaller: zspeed plan --params N gives it for a machine)")


def estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5) -> None:
    """:func:`estimate_zero2_model_states_mem_needs_all_cold` for ``model``'s parameter count."""
    estimate_zero2_model_states_mem_needs_all_cold(model_to_params(model), num_gpus_per_node, num_nodes,
                                                   additional_buffer_factor)
