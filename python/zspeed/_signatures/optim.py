"""Signatures, structs, enums and constants of include/zspeed/optim.h."""
from ctypes import POINTER, Structure, c_double, c_int, c_int64, c_size_t, c_void_p
from enum import IntEnum


class DType(IntEnum):
    """enum zs_dtype: element types of optimizer buffers."""
    F32 = 0
    BF16 = 1
    F16 = 2
    Q8 = 3
    NONE = -1


# Short names for the members, as the wrappers use them.
F32, BF16, F16, Q8, NONE = DType.F32, DType.BF16, DType.F16, DType.Q8, DType.NONE
# Elements per thread-pool chunk and per 8-bit quantization block.
OPTIM_CHUNK = 16384
OPTIM_QBLOCK = 256


class OptimTensors(Structure):
    """struct zs_optim_tensors."""
    _fields_ = [("n", c_size_t),
                ("param", c_void_p), ("param_dtype", c_int),
                ("grad", c_void_p), ("grad_dtype", c_int),
                ("m", c_void_p), ("v", c_void_p), ("state_dtype", c_int),
                ("m_scale", c_void_p), ("v_scale", c_void_p),
                ("out", c_void_p), ("out_dtype", c_int)]


class AdamConfig(Structure):
    """struct zs_adam_config."""
    _fields_ = [("lr", c_double), ("beta1", c_double), ("beta2", c_double),
                ("eps", c_double), ("weight_decay", c_double),
                ("grad_scale", c_double), ("step", c_int64),
                ("adamw_mode", c_int), ("bias_correction", c_int),
                ("amsgrad", c_int), ("num_threads", c_int), ("pool", c_void_p)]


class AdagradConfig(Structure):
    """struct zs_adagrad_config."""
    _fields_ = [("lr", c_double), ("lr_decay", c_double),
                ("weight_decay", c_double), ("eps", c_double),
                ("grad_scale", c_double), ("num_threads", c_int),
                ("pool", c_void_p)]


class LionConfig(Structure):
    """struct zs_lion_config."""
    _fields_ = [("lr", c_double), ("beta1", c_double), ("beta2", c_double),
                ("weight_decay", c_double), ("grad_scale", c_double),
                ("num_threads", c_int), ("pool", c_void_p)]


ENUMS = {"zs_dtype": (DType, "ZS_DTYPE_")}
STRUCTS = {"zs_optim_tensors": OptimTensors, "zs_adam_config": AdamConfig,
           "zs_adagrad_config": AdagradConfig, "zs_lion_config": LionConfig}
CONSTANTS = {"ZS_OPTIM_CHUNK": OPTIM_CHUNK, "ZS_OPTIM_QBLOCK": OPTIM_QBLOCK}

SIGNATURES = {
    "zs_optim_tensors_init": (None, [POINTER(OptimTensors)]),
    "zs_optim_qblocks": (c_size_t, [c_size_t]),
    "zs_adam_config_init": (None, [POINTER(AdamConfig)]),
    "zs_adam_step": (c_int, [POINTER(AdamConfig), POINTER(OptimTensors)]),
    "zs_adagrad_config_init": (None, [POINTER(AdagradConfig)]),
    "zs_adagrad_step": (c_int, [POINTER(AdagradConfig), POINTER(OptimTensors)]),
    "zs_lion_config_init": (None, [POINTER(LionConfig)]),
    "zs_lion_step": (c_int, [POINTER(LionConfig), POINTER(OptimTensors)]),
    "zs_grad_stats": (c_int, [c_void_p, c_int, c_size_t, c_double, c_void_p,
                              c_int, POINTER(c_double), POINTER(c_int)]),
    # Buffers are passed as addresses (c_void_p): numpy .ctypes.data or
    # torch .data_ptr().
    "zs_adam_q8_dequantize": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p,
                                      c_size_t, c_void_p, c_void_p]),
    "zs_adam_q8_quantize": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p,
                                    c_void_p, c_void_p, c_void_p]),
}
