"""Signatures of include/zspeed/zspeed.h."""
from ctypes import (CFUNCTYPE, POINTER, c_char_p, c_int, c_int64, c_size_t,
                    c_uint, c_uint32, c_uint64, c_void_p)

RANGE_FN = CFUNCTYPE(None, c_void_p, c_size_t, c_size_t, c_int)
TASK_FN = CFUNCTYPE(None, c_void_p)

SIGNATURES = {
    "zs_version": (c_uint, []),
    "zs_version_string": (c_char_p, []),
    "zs_strerror": (c_char_p, [c_int]),
    "zs_err_name": (c_char_p, [c_int]),
    "zs_last_error": (c_char_p, []),
    "zs_cpu_features": (c_uint32, []),
    "zs_cpu_model": (c_char_p, []),
    "zs_cpu_count": (c_int, []),
    "zs_ram_bytes": (c_uint64, []),
    "zs_simd_best": (c_int, []),
    "zs_simd_level": (c_int, []),
    "zs_simd_force": (c_int, [c_char_p]),
    "zs_simd_name": (c_char_p, [c_int]),
    "zs_alloc_aligned": (c_int, [POINTER(c_void_p), c_size_t, c_size_t]),
    "zs_free_aligned": (None, [c_void_p]),
    "zs_alloc_pinned": (c_int, [POINTER(c_void_p), c_size_t, c_uint, POINTER(c_int)]),
    "zs_free_pinned": (None, [c_void_p, c_size_t]),
    "zs_memlock_limit": (c_uint64, []),
    "zs_pool_create": (c_int, [POINTER(c_void_p), c_int]),
    "zs_pool_destroy": (None, [c_void_p]),
    "zs_pool_size": (c_int, [c_void_p]),
    "zs_pool_default": (c_void_p, []),
    "zs_pool_parallel_for": (c_int, [c_void_p, c_size_t, c_size_t, c_int, RANGE_FN, c_void_p]),
    "zs_pool_submit": (c_int, [c_void_p, TASK_FN, c_void_p]),
    "zs_report": (c_int64, [c_char_p, c_size_t, c_uint]),
    "zs_report_problems": (c_int, [c_char_p, c_size_t]),
    "zs_abi_entry": (c_int, [c_int, POINTER(c_int), POINTER(c_char_p),
                             POINTER(c_char_p), POINTER(c_int64), POINTER(c_int64)]),
    "zs_fault_set": (c_int, [c_char_p, c_int, c_int, c_int]),
    "zs_fault_clear": (None, []),
}
