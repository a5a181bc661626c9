/* abi.c - zs_abi_entry(): the public structs (size, alignment, every
 * field's offset and size), enums and constants as this build compiled
 * them. Bindings that copy them by hand, like the Python package's ctypes
 * mirrors, check their copies against this table instead of trusting that
 * nobody changed a header. A struct's fields follow its own entry, in
 * declaration order. A field added to a header and not here fails a test:
 * tests/c/test_abi.c finds the gap it leaves (unless it fits in padding),
 * and tests/python/test_native.py compares the names with the headers. */
#include <stddef.h>

#include "report/report_internal.h"
#include "zspeed/aio.h"
#include "zspeed/optim.h"
#include "zspeed/swap.h"

typedef struct {
  int kind;
  const char *scope, *name;
  int64_t value, size;
} zs__abi_row;

#define ZS__STRUCT(T) \
  {ZS_ABI_STRUCT, #T, #T, (int64_t)sizeof(T), (int64_t)_Alignof(T)}
#define ZS__FIELD(T, f) \
  {ZS_ABI_FIELD, #T, #f, (int64_t)offsetof(T, f), (int64_t)sizeof(((T *)0)->f)}
#define ZS__ENUM(E, v) \
  {ZS_ABI_ENUM, #E, #v, (int64_t)(v), (int64_t)sizeof(enum E)}
#define ZS__CONST(v) {ZS_ABI_CONSTANT, "constant", #v, (int64_t)(v), 0}

static const zs__abi_row zs__abi[] = {
    /* zspeed.h */
    ZS__ENUM(zs_cpu_feature, ZS_CPU_SSE2),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_AVX),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_AVX2),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_FMA),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_F16C),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_AVX512F),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_AVX512BW),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_AVX512VL),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_AVX512DQ),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_AVX512BF16),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_NEON),
    ZS__ENUM(zs_cpu_feature, ZS_CPU_SVE),
    ZS__ENUM(zs_simd_level, ZS_SIMD_SCALAR),
    ZS__ENUM(zs_simd_level, ZS_SIMD_AVX2),
    ZS__ENUM(zs_simd_level, ZS_SIMD_AVX512),
    ZS__ENUM(zs_simd_level, ZS_SIMD_NEON),
    ZS__ENUM(zs_pin_flags, ZS_PIN_FALLBACK),
    ZS__ENUM(zs_report_flags, ZS_REPORT_JSON),
    ZS__ENUM(zs_abi_kind, ZS_ABI_STRUCT),
    ZS__ENUM(zs_abi_kind, ZS_ABI_FIELD),
    ZS__ENUM(zs_abi_kind, ZS_ABI_ENUM),
    ZS__ENUM(zs_abi_kind, ZS_ABI_CONSTANT),

    /* optim.h */
    ZS__ENUM(zs_dtype, ZS_DTYPE_F32),
    ZS__ENUM(zs_dtype, ZS_DTYPE_BF16),
    ZS__ENUM(zs_dtype, ZS_DTYPE_F16),
    ZS__ENUM(zs_dtype, ZS_DTYPE_Q8),
    ZS__ENUM(zs_dtype, ZS_DTYPE_NONE),
    ZS__CONST(ZS_OPTIM_CHUNK),
    ZS__CONST(ZS_OPTIM_QBLOCK),
    ZS__STRUCT(zs_optim_tensors),
    ZS__FIELD(zs_optim_tensors, n),
    ZS__FIELD(zs_optim_tensors, param),
    ZS__FIELD(zs_optim_tensors, param_dtype),
    ZS__FIELD(zs_optim_tensors, grad),
    ZS__FIELD(zs_optim_tensors, grad_dtype),
    ZS__FIELD(zs_optim_tensors, m),
    ZS__FIELD(zs_optim_tensors, v),
    ZS__FIELD(zs_optim_tensors, state_dtype),
    ZS__FIELD(zs_optim_tensors, m_scale),
    ZS__FIELD(zs_optim_tensors, v_scale),
    ZS__FIELD(zs_optim_tensors, out),
    ZS__FIELD(zs_optim_tensors, out_dtype),
    ZS__STRUCT(zs_adam_config),
    ZS__FIELD(zs_adam_config, lr),
    ZS__FIELD(zs_adam_config, beta1),
    ZS__FIELD(zs_adam_config, beta2),
    ZS__FIELD(zs_adam_config, eps),
    ZS__FIELD(zs_adam_config, weight_decay),
    ZS__FIELD(zs_adam_config, grad_scale),
    ZS__FIELD(zs_adam_config, step),
    ZS__FIELD(zs_adam_config, adamw_mode),
    ZS__FIELD(zs_adam_config, bias_correction),
    ZS__FIELD(zs_adam_config, amsgrad),
    ZS__FIELD(zs_adam_config, num_threads),
    ZS__FIELD(zs_adam_config, pool),
    ZS__STRUCT(zs_adagrad_config),
    ZS__FIELD(zs_adagrad_config, lr),
    ZS__FIELD(zs_adagrad_config, lr_decay),
    ZS__FIELD(zs_adagrad_config, weight_decay),
    ZS__FIELD(zs_adagrad_config, eps),
    ZS__FIELD(zs_adagrad_config, grad_scale),
    ZS__FIELD(zs_adagrad_config, num_threads),
    ZS__FIELD(zs_adagrad_config, pool),
    ZS__STRUCT(zs_lion_config),
    ZS__FIELD(zs_lion_config, lr),
    ZS__FIELD(zs_lion_config, beta1),
    ZS__FIELD(zs_lion_config, beta2),
    ZS__FIELD(zs_lion_config, weight_decay),
    ZS__FIELD(zs_lion_config, grad_scale),
    ZS__FIELD(zs_lion_config, num_threads),
    ZS__FIELD(zs_lion_config, pool),

    /* aio.h */
    ZS__ENUM(zs_aio_backend, ZS_AIO_BACKEND_AUTO),
    ZS__ENUM(zs_aio_backend, ZS_AIO_BACKEND_IO_URING),
    ZS__ENUM(zs_aio_backend, ZS_AIO_BACKEND_THREADS),
    ZS__ENUM(zs_aio_backend, ZS_AIO_BACKEND_IOCP),
    ZS__ENUM(zs_aio_direct, ZS_AIO_DIRECT_AUTO),
    ZS__ENUM(zs_aio_direct, ZS_AIO_DIRECT_ON),
    ZS__ENUM(zs_aio_direct, ZS_AIO_DIRECT_OFF),
    ZS__ENUM(zs_aio_open_flags, ZS_AIO_READ),
    ZS__ENUM(zs_aio_open_flags, ZS_AIO_WRITE),
    ZS__ENUM(zs_aio_open_flags, ZS_AIO_RDWR),
    ZS__ENUM(zs_aio_open_flags, ZS_AIO_CREATE),
    ZS__ENUM(zs_aio_open_flags, ZS_AIO_TRUNCATE),
    ZS__ENUM(zs_aio_open_flags, ZS_AIO_DIRECT_REQUIRE),
    ZS__ENUM(zs_aio_open_flags, ZS_AIO_BUFFERED),
    ZS__STRUCT(zs_aio_config),
    ZS__FIELD(zs_aio_config, block_size),
    ZS__FIELD(zs_aio_config, queue_depth),
    ZS__FIELD(zs_aio_config, single_submit),
    ZS__FIELD(zs_aio_config, overlap_events),
    ZS__FIELD(zs_aio_config, intra_op_parallelism),
    ZS__FIELD(zs_aio_config, backend),
    ZS__FIELD(zs_aio_config, direct),
    ZS__STRUCT(zs_aio_stats),
    ZS__FIELD(zs_aio_stats, bytes_read),
    ZS__FIELD(zs_aio_stats, bytes_written),
    ZS__FIELD(zs_aio_stats, requests),
    ZS__FIELD(zs_aio_stats, requests_failed),
    ZS__FIELD(zs_aio_stats, pieces),
    ZS__FIELD(zs_aio_stats, pieces_bounced),
    ZS__FIELD(zs_aio_stats, pieces_buffered),
    ZS__FIELD(zs_aio_stats, short_continued),
    ZS__FIELD(zs_aio_stats, request_ns),
    ZS__FIELD(zs_aio_stats, busy_ns),

    /* swap.h */
    ZS__ENUM(zs_swap_optimizer, ZS_SWAP_ADAM),
    ZS__ENUM(zs_swap_optimizer, ZS_SWAP_ADAGRAD),
    ZS__ENUM(zs_swap_optimizer, ZS_SWAP_LION),
    ZS__STRUCT(zs_swap_config),
    ZS__FIELD(zs_swap_config, path),
    ZS__FIELD(zs_swap_config, name),
    ZS__FIELD(zs_swap_config, overwrite),
    ZS__FIELD(zs_swap_config, partitions),
    ZS__FIELD(zs_swap_config, sizes),
    ZS__FIELD(zs_swap_config, buffer_count),
    ZS__FIELD(zs_swap_config, optimizer),
    ZS__FIELD(zs_swap_config, state_dtype),
    ZS__FIELD(zs_swap_config, lr),
    ZS__FIELD(zs_swap_config, beta1),
    ZS__FIELD(zs_swap_config, beta2),
    ZS__FIELD(zs_swap_config, eps),
    ZS__FIELD(zs_swap_config, weight_decay),
    ZS__FIELD(zs_swap_config, adamw_mode),
    ZS__FIELD(zs_swap_config, bias_correction),
    ZS__FIELD(zs_swap_config, num_threads),
    ZS__FIELD(zs_swap_config, pool),
    ZS__FIELD(zs_swap_config, aio),
    ZS__FIELD(zs_swap_config, direct),
    ZS__FIELD(zs_swap_config, sync_each_step),
    ZS__FIELD(zs_swap_config, compact),
    ZS__STRUCT(zs_swap_step_args),
    ZS__FIELD(zs_swap_step_args, grads),
    ZS__FIELD(zs_swap_step_args, grad_dtype),
    ZS__FIELD(zs_swap_step_args, outs),
    ZS__FIELD(zs_swap_step_args, out_dtype),
    ZS__FIELD(zs_swap_step_args, grad_scale),
    ZS__FIELD(zs_swap_step_args, lr),
    ZS__FIELD(zs_swap_step_args, step),
    ZS__FIELD(zs_swap_step_args, resumable),
    ZS__STRUCT(zs_swap_stats),
    ZS__FIELD(zs_swap_stats, steps),
    ZS__FIELD(zs_swap_stats, failed_steps),
    ZS__FIELD(zs_swap_stats, bytes_read),
    ZS__FIELD(zs_swap_stats, bytes_written),
    ZS__FIELD(zs_swap_stats, step_ns),
    ZS__FIELD(zs_swap_stats, compute_ns),
    ZS__FIELD(zs_swap_stats, read_wait_ns),
    ZS__FIELD(zs_swap_stats, write_wait_ns),
    ZS__FIELD(zs_swap_stats, sync_ns),
    ZS__FIELD(zs_swap_stats, last_step_ns),
};

int zs_abi_entry(int i, int *kind, const char **scope, const char **name,
                 int64_t *value, int64_t *size) {
  const zs__abi_row *r;
  if (i < 0 || (size_t)i >= ZS_ARRAY_SIZE(zs__abi)) return 0;
  r = &zs__abi[i];
  if (kind) *kind = r->kind;
  if (scope) *scope = r->scope;
  if (name) *name = r->name;
  if (value) *value = r->value;
  if (size) *size = r->size;
  return 1;
}
