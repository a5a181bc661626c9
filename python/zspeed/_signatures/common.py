"""Signatures, enums and constants of include/zspeed/zspeed.h."""
from ctypes import (CFUNCTYPE, POINTER, c_char_p, c_int, c_int64, c_size_t,
                    c_uint, c_uint32, c_uint64, c_void_p)
from enum import IntEnum, IntFlag


class CpuFeature(IntFlag):
    """enum zs_cpu_feature: bits of zs_cpu_features()."""
    SSE2 = 1 << 0
    AVX = 1 << 1
    AVX2 = 1 << 2
    FMA = 1 << 3
    F16C = 1 << 4
    AVX512F = 1 << 5
    AVX512BW = 1 << 6
    AVX512VL = 1 << 7
    AVX512DQ = 1 << 8
    AVX512BF16 = 1 << 9
    NEON = 1 << 16
    SVE = 1 << 17


class SimdLevel(IntEnum):
    """enum zs_simd_level."""
    SCALAR = 0
    AVX2 = 1
    AVX512 = 2
    NEON = 3


class PinFlags(IntFlag):
    """enum zs_pin_flags (zs_alloc_pinned)."""
    FALLBACK = 1 << 0


class ReportFlags(IntFlag):
    """enum zs_report_flags (zs_report)."""
    JSON = 1 << 0


class AbiKind(IntEnum):
    """enum zs_abi_kind: the kinds of rows of zs_abi_entry."""
    STRUCT = 0
    FIELD = 1
    ENUM = 2
    CONSTANT = 3


ENUMS = {
    "zs_cpu_feature": (CpuFeature, "ZS_CPU_"),
    "zs_simd_level": (SimdLevel, "ZS_SIMD_"),
    "zs_pin_flags": (PinFlags, "ZS_PIN_"),
    "zs_report_flags": (ReportFlags, "ZS_REPORT_"),
    "zs_abi_kind": (AbiKind, "ZS_ABI_"),
}
STRUCTS: dict = {}
CONSTANTS: dict = {}

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
    "zs_advise_huge_pages": (c_int, [c_void_p, c_size_t]),
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
