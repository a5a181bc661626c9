"""Signatures, structs and enums of include/zspeed/aio.h."""
from ctypes import (POINTER, Structure, c_char_p, c_int, c_int64, c_size_t,
                    c_uint, c_uint32, c_uint64, c_void_p)
from enum import IntEnum, IntFlag


class AioBackend(IntEnum):
    """enum zs_aio_backend; the lower-case member names ("io_uring") are the
    names users pass (ZSPEED_AIO_BACKEND, backend=...)."""
    AUTO = 0
    IO_URING = 1
    THREADS = 2
    IOCP = 3


class AioDirect(IntEnum):
    """enum zs_aio_direct: the direct I/O policy ("auto", "on", "off")."""
    AUTO = 0
    ON = 1
    OFF = 2


class AioOpen(IntFlag):
    """enum zs_aio_open_flags (zs_aio_file_open)."""
    READ = 0
    WRITE = 1
    RDWR = 2
    CREATE = 1 << 2
    TRUNCATE = 1 << 3
    DIRECT_REQUIRE = 1 << 4
    BUFFERED = 1 << 5


class AioConfig(Structure):
    """struct zs_aio_config; fill with zs_aio_config_init first."""
    _fields_ = [("block_size", c_int64), ("queue_depth", c_int),
                ("single_submit", c_int), ("overlap_events", c_int),
                ("intra_op_parallelism", c_int), ("backend", c_int),
                ("direct", c_int)]


class AioStats(Structure):
    """struct zs_aio_stats."""
    _fields_ = [(n, c_uint64) for n in (
        "bytes_read", "bytes_written", "requests", "requests_failed", "pieces",
        "pieces_bounced", "pieces_buffered", "short_continued", "request_ns",
        "busy_ns")]


ENUMS = {"zs_aio_backend": (AioBackend, "ZS_AIO_BACKEND_"),
         "zs_aio_direct": (AioDirect, "ZS_AIO_DIRECT_"),
         "zs_aio_open_flags": (AioOpen, "ZS_AIO_")}
STRUCTS = {"zs_aio_config": AioConfig, "zs_aio_stats": AioStats}
CONSTANTS: dict = {}

SIGNATURES = {
    "zs_aio_config_init": (None, [POINTER(AioConfig)]),
    "zs_aio_backend_name": (c_char_p, [c_int]),
    "zs_aio_backend_available": (c_int, [c_int, c_char_p, c_size_t]),
    "zs_aio_backend_resolve": (c_int, [c_int, c_char_p, c_size_t]),
    "zs_aio_create": (c_int, [POINTER(c_void_p), POINTER(AioConfig)]),
    "zs_aio_destroy": (None, [c_void_p]),
    "zs_aio_get_config": (None, [c_void_p, POINTER(AioConfig)]),
    "zs_aio_backend": (c_char_p, [c_void_p]),
    "zs_aio_backend_why": (c_char_p, [c_void_p]),
    "zs_aio_file_open": (c_int, [POINTER(c_void_p), c_char_p, c_uint]),
    "zs_aio_file_close": (c_int, [c_void_p]),
    "zs_aio_file_direct": (c_int, [c_void_p]),
    "zs_aio_file_why": (c_char_p, [c_void_p]),
    "zs_aio_file_alignment": (c_uint32, [c_void_p]),
    "zs_aio_file_size": (c_int64, [c_void_p]),
    "zs_aio_file_preallocate": (c_int, [c_void_p, c_int64]),
    "zs_aio_file_sync": (c_int, [c_void_p]),
    "zs_aio_pread": (c_int64, [c_void_p, c_void_p, c_void_p, c_int64, c_int64]),
    "zs_aio_pwrite": (c_int64, [c_void_p, c_void_p, c_void_p, c_int64, c_int64]),
    "zs_aio_pread_path": (c_int64, [c_void_p, c_char_p, c_void_p, c_int64, c_int64]),
    "zs_aio_pwrite_path": (c_int64, [c_void_p, c_char_p, c_void_p, c_int64, c_int64]),
    "zs_aio_wait": (c_int, [c_void_p, c_int64]),
    "zs_aio_test": (c_int, [c_void_p, c_int64]),
    "zs_aio_wait_all": (c_int64, [c_void_p]),
    "zs_aio_pending": (c_int64, [c_void_p]),
    "zs_aio_completions": (c_uint64, [c_void_p]),
    "zs_aio_wait_completion": (None, [c_void_p, c_uint64]),
    "zs_aio_read": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64]),
    "zs_aio_write": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64]),
    "zs_aio_stats_get": (None, [c_void_p, POINTER(AioStats)]),
    "zs_aio_stats_reset": (None, [c_void_p]),
}
