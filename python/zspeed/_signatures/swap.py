"""Signatures, structs and enums of include/zspeed/swap.h."""
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int64,
                    c_uint64, c_void_p)
from enum import IntEnum


class SwapOptimizer(IntEnum):
    """enum zs_swap_optimizer."""
    ADAM = 0
    ADAGRAD = 1
    LION = 2


class SwapConfig(Structure):
    """struct zs_swap_config; fill with zs_swap_config_init first."""
    _fields_ = [("path", c_char_p), ("name", c_char_p), ("overwrite", c_int),
                ("partitions", c_int), ("sizes", POINTER(c_uint64)),
                ("buffer_count", c_int), ("optimizer", c_int),
                ("state_dtype", c_int), ("lr", c_double), ("beta1", c_double),
                ("beta2", c_double), ("eps", c_double),
                ("weight_decay", c_double), ("adamw_mode", c_int),
                ("bias_correction", c_int), ("num_threads", c_int),
                ("pool", c_void_p), ("aio", c_void_p), ("direct", c_int),
                ("sync_each_step", c_int), ("compact", c_int)]


class SwapStepArgs(Structure):
    """struct zs_swap_step_args; fill with zs_swap_step_args_init first."""
    _fields_ = [("grads", POINTER(c_void_p)), ("grad_dtype", c_int),
                ("outs", POINTER(c_void_p)), ("out_dtype", c_int),
                ("grad_scale", c_double), ("lr", c_double), ("step", c_int64),
                ("resumable", c_int)]


class SwapStats(Structure):
    """struct zs_swap_stats."""
    _fields_ = [(n, c_uint64) for n in (
        "steps", "failed_steps", "bytes_read", "bytes_written", "step_ns",
        "compute_ns", "read_wait_ns", "write_wait_ns", "sync_ns",
        "last_step_ns")]


ENUMS = {"zs_swap_optimizer": (SwapOptimizer, "ZS_SWAP_")}
STRUCTS = {"zs_swap_config": SwapConfig, "zs_swap_step_args": SwapStepArgs,
           "zs_swap_stats": SwapStats}
CONSTANTS: dict = {}

_D = POINTER(c_double)
_I64 = POINTER(c_int64)

SIGNATURES = {
    "zs_swap_config_init": (None, [POINTER(SwapConfig)]),
    "zs_swap_step_args_init": (None, [POINTER(SwapStepArgs)]),
    "zs_swap_create": (c_int, [POINTER(c_void_p), POINTER(SwapConfig)]),
    "zs_swap_destroy": (c_int, [c_void_p]),
    "zs_swap_init_partition": (c_int, [c_void_p, c_int, c_void_p]),
    "zs_swap_step": (c_int, [c_void_p, POINTER(SwapStepArgs)]),
    "zs_swap_io_pass": (c_int, [c_void_p, c_void_p, c_int, c_void_p, c_int64,
                                c_int, c_int, POINTER(c_uint64)]),
    "zs_swap_set_hparams": (c_int, [c_void_p, c_double, c_double, c_double,
                                    c_double, c_double]),
    "zs_swap_get_hparams": (None, [c_void_p, _D, _D, _D, _D, _D]),
    "zs_swap_steps": (c_int64, [c_void_p]),
    "zs_swap_incomplete_step": (c_int64, [c_void_p]),
    "zs_swap_abandon_step": (c_int, [c_void_p]),
    "zs_swap_set_steps": (c_int, [c_void_p, c_int64]),
    "zs_swap_get_state": (c_int, [c_void_p, c_int, c_void_p, c_void_p, c_void_p]),
    "zs_swap_set_state": (c_int, [c_void_p, c_int, c_void_p, c_void_p, c_void_p]),
    "zs_swap_read_arrays": (c_int, [c_void_p, c_int, c_void_p, c_void_p, c_void_p,
                                    c_void_p, c_void_p]),
    "zs_swap_write_arrays": (c_int, [c_void_p, c_int, c_void_p, c_void_p, c_void_p,
                                     c_void_p, c_void_p]),
    "zs_swap_image_bytes": (c_int64, [c_void_p, c_int]),
    "zs_swap_layout": (c_int, [c_void_p, c_int, _I64, _I64, _I64, _I64, _I64, _I64]),
    "zs_swap_read_image": (c_int, [c_void_p, c_int, c_void_p, c_int64]),
    "zs_swap_write_image": (c_int, [c_void_p, c_int, c_void_p, c_int64]),
    "zs_swap_partitions": (c_int, [c_void_p]),
    "zs_swap_partition_size": (c_uint64, [c_void_p, c_int]),
    "zs_swap_file_path": (c_char_p, [c_void_p]),
    "zs_swap_file_bytes": (c_int64, [c_void_p]),
    "zs_swap_compact": (c_int, [c_void_p]),
    "zs_swap_holds_state": (c_int, [c_void_p, c_int]),
    "zs_swap_direct": (c_int, [c_void_p]),
    "zs_swap_direct_why": (c_char_p, [c_void_p]),
    "zs_swap_buffers_locked": (c_int, [c_void_p]),
    "zs_swap_backend": (c_char_p, [c_void_p]),
    "zs_swap_stats_get": (None, [c_void_p, POINTER(SwapStats)]),
    "zs_swap_stats_reset": (None, [c_void_p]),
}
