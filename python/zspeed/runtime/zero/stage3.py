"""DeepSpeed's ``deepspeed.runtime.zero.stage3``: the class of ``engine.optimizer`` at ZeRO stage 3,
DeepSpeed's estimators of the memory ZeRO-3 needs, and ``unwrap_model_for_generation``.

:class:`DeepSpeedZeroOptimizer_Stage3` is what ``engine.optimizer`` is at stage 3, so that
``isinstance`` checks against DeepSpeed's class hold; it is the engine's optimizer wrapper
(runtime/engine_optimizer.py), built by ``initialize``. The estimators give DeepSpeed's numbers
(its formulas, for DeepSpeed's layout); zspeed's own footprint is smaller (docs/ZERO3.md) and
``zspeed plan`` gives it.
"""
from __future__ import annotations


from ..engine_optimizer import EngineOptimizer
from . import unwrap_model_for_generation  # noqa: F401 - DeepSpeed's name here too

__all__ = ["DeepSpeedZeroOptimizer_Stage3", "estimate_zero3_model_states_mem_needs",
           "estimate_zero3_model_states_mem_needs_all_live", "estimate_zero3_model_states_mem_needs_all_cold",
           "model_to_params", "unwrap_model_for_generation"]


class DeepSpeedZeroOptimizer_Stage3(EngineOptimizer):  # noqa: N801 - DeepSpeed's name
    """``engine.optimizer`` at ZeRO stage 3 (see the module docstring)."""

    @property
    def fp32_partitioned_groups_flat(self) -> list:
        """DeepSpeed's name for the fp32 masters, read by checkpoint checks: copies, taken when read, of the fp32 master weights this rank holds
        per parameter group, flat (zspeed's partitioning, so the layout is zspeed's, not DeepSpeed's;
        writing into them does not change the masters: use the tensor-fragment API for that)."""
        return self._fp32_flat()


def model_to_params(model) -> tuple[int, int]:
    """(parameter count, a tensor shared by several parameters counted once; the largest count of
    one module's own parameters). Partitioned parameters count their whole size."""
    def n(p):
        return int(getattr(p, "ds_numel", p.numel()))
    total = sum({id(p): n(p) for p in model.parameters()}.values())
    largest = max((sum(n(p) for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return total, largest


def estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1,
                                          cpu_offload=True, cpu_offload_params=True, zero_init=True,
                                          additional_buffer_factor=1.5) -> tuple[int, int, int]:
    """(bytes per CPU, bytes per GPU, bytes of the largest layer) that DeepSpeed's ZeRO-3 needs for
    the parameters, gradients and optimizer state (its formula: the largest layer at 4 bytes per
    parameter on each GPU; with the optimizer offloaded 18 (parameters offloaded too) or 16 bytes
    per parameter on the host, per node, and 2 bytes per parameter over the GPUs when only the
    optimizer is offloaded; without offload 18 bytes per parameter over the GPUs; without zero.Init
    the host holds at least 4 bytes per parameter per GPU of the node), host figures times
    ``additional_buffer_factor``."""
    gpus = num_nodes * num_gpus_per_node
    largest = 4 * largest_layer_params
    gpu, cold, warm = _ZERO3[bool(cpu_offload), bool(cpu_offload) and bool(cpu_offload_params)](
        total_params, largest_layer_params, gpus, num_gpus_per_node, num_nodes)
    cpu = (warm if zero_init else cold) * additional_buffer_factor
    return int(cpu), int(largest + gpu), largest


# (optimizer offloaded, parameters offloaded) -> (GPU bytes beside the largest layer, host bytes
# without zero.Init, host bytes with it)(params, largest layer's params, GPUs, GPUs per node, nodes)
_ZERO3 = {
    (True, True): lambda n, big, gpus, per_node, nodes: (0, n * max(4 * per_node, 18 / nodes), n * 18 / nodes),
    (True, False): lambda n, big, gpus, per_node, nodes: (int(2 * n / gpus), n * max(4 * per_node, 16 / nodes),
                                                         n * 16 / nodes),
    (False, False): lambda n, big, gpus, per_node, nodes: (int(18 * n / gpus), n * 4 * per_node, big * 4 * per_node)}
_DEVICE = {True: "cpu", False: "none"}


def estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params, num_gpus_per_node=1,
                                                   num_nodes=1, additional_buffer_factor=1.5) -> None:
    """Prints :func:`estimate_zero3_model_states_mem_needs` for each offload choice, with and
    without zero.Init."""
    print(f"DeepSpeed's estimate of the memory ZeRO-3 needs for parameters, gradients and optimizer state:\n"
          f"  {num_nodes} node(s) x {num_gpus_per_node} GPU(s), {int(total_params / 1e6)}M parameters, largest "
          f"layer {int(largest_layer_params / 1e6)}M parameters\n"
          f"  per CPU  |  per GPU | options")
    for offload, params in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total_params, largest_layer_params,
                                                                num_gpus_per_node, num_nodes, offload, params,
                                                                zero_init, additional_buffer_factor)
            print(f"  {cpu / 2**30:7.2f}GB | {gpu / 2**30:6.2f}GB | offload_param={_DEVICE[params]}, "
                  f"offload_optimizer={_DEVICE[offload]}, zero_init={int(zero_init)}")
    print("  (zspeed's own footprint is smaller: zspeed plan --params N gives it for a machine)")


def estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5) -> None:
    """:func:`estimate_zero3_model_states_mem_needs_all_cold` for ``model``'s counts."""
    total, largest = model_to_params(model)
    estimate_zero3_model_states_mem_needs_all_cold(total, largest, num_gpus_per_node, num_nodes,
                                                   additional_buffer_factor)
