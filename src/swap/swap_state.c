/* swap_state.c - reading and replacing one partition's state outside a
 * step: initialization from fp32 params, fp32 views for checkpoints, and
 * raw images for bit-exact checkpoints. Every write goes to a slot that
 * holds no state and becomes the partition's only after the write
 * succeeded, so a failure keeps the old state. These calls use buffer 0 as scratch (no step runs
 * at the same time: one call at a time per handle); while a resumable step
 * is incomplete the buffers hold images still to be written, so the reads
 * use a spare buffer then and the writes are refused. Built on swap.c's
 * slots (reserve, commit, unreserve) and its checks; swap.c calls nothing
 * here. */
#include <string.h>

#include "swap/swap_internal.h"

static int check_part(const zs_swap *s, int part, const char *fn) {
  if (!s) return zs__fail(ZS_EINVAL, "%s: s is NULL", fn);
  if (part < 0 || part >= s->nparts)
    return zs__fail(ZS_EINVAL, "%s: partition %d out of range [0, %d)", fn,
                    part, s->nparts);
  return 0;
}

/* The buffer these calls use as scratch: buffer 0, or (while a resumable
 * step is incomplete) the spare one, allocated on first use. */
static int scratch(zs_swap *s, void **buf) {
  if (!s->inc_step) {
    *buf = s->bufs[0];
    return 0;
  }
  if (!s->spare) {
    int locked = 0, rc = zs_alloc_pinned(&s->spare, s->bufbytes,
                                         ZS_PIN_FALLBACK, &locked);
    if (rc < 0)
      return zs__fail_prefix(rc, "allocating a %zu-byte scratch buffer for "
                             "a read during an incomplete step", s->bufbytes);
  }
  *buf = s->spare;
  return 0;
}

/* Reads / writes one image of one partition at file offset off
 * synchronously through the aio handle, applying the "swap.read" /
 * "swap.write" fault sites. */
static int image_io(zs_swap *s, int part, int64_t off, void *buf,
                    int write) {
  zs__swap_part *p = &s->parts[part];
  int rc = write ? zs_aio_write(s->aio, s->file, buf, p->slot, off)
                 : zs_aio_read(s->aio, s->file, buf, p->slot, off);
  if (rc == 0) rc = zs__swap_fault(write, part);
  if (rc < 0)
    return zs__fail_prefix(rc, "%s partition %d (%lld bytes at offset %lld "
                           "of %s)", write ? "writing" : "reading", part,
                           (long long)p->slot, (long long)off, s->path);
  if (write)
    s->stats.bytes_written += (uint64_t)p->slot;
  else
    s->stats.bytes_read += (uint64_t)p->slot;
  return 0;
}

/* Writes buffer 0 to a slot that holds no state and commits it as part's
 * image only once the write succeeded. */
static int commit_buf0(zs_swap *s, int part) {
  int64_t off = zs__swap_reserve(s, part);
  int rc = off < 0 ? (int)off : image_io(s, part, off, s->bufs[0], 1);
  if (rc < 0) {
    zs__swap_unreserve(s, part);
    return rc;
  }
  zs__swap_commit(s, part);
  s->parts[part].ready = 1;
  s->parts[part].dropped = 0;
  return 0;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Stores n fp32 values (NULL = zeros) as the state dtype at dst. */
static void put_state(int dt, void *dst, const float *src, size_t n) {
  size_t i;
  if (!src) {
    memset(dst, 0, n * zs__swap_state_es(dt));
  } else if (dt == ZS_DTYPE_F32) {
    memcpy(dst, src, n * 4);
  } else {
    uint16_t *d = dst;
    for (i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
  }
}

static void get_state(int dt, float *dst, const void *src, size_t n) {
  size_t i;
  if (dt == ZS_DTYPE_F32) {
    memcpy(dst, src, n * 4);
  } else {
    const uint16_t *s = src;
    for (i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
  }
}

static int check_state_ptrs(const zs_swap *s, const char *fn, const void *m,
                            const void *v) {
  if (m && s->optimizer == ZS_SWAP_ADAGRAD)
    return zs__fail(ZS_EINVAL, "%s: Adagrad has no m (its sum is v); pass "
                    "NULL", fn);
  if (v && s->optimizer == ZS_SWAP_LION)
    return zs__fail(ZS_EINVAL, "%s: Lion has no v (its state is m); pass "
                    "NULL", fn);
  return 0;
}

int zs_swap_set_state(zs_swap *s, int part, const float *param,
                      const float *m, const float *v) {
  const char *fn = "zs_swap_set_state";
  zs__swap_part *p;
  unsigned char *b;
  int rc;
  if ((rc = check_part(s, part, fn)) < 0) return rc;
  if ((rc = zs__swap_check_complete(s, fn)) < 0) return rc;
  if (!param) return zs__fail(ZS_EINVAL, "%s: param is NULL", fn);
  if ((rc = check_state_ptrs(s, fn, m, v)) < 0) return rc;
  p = &s->parts[part];
  b = s->bufs[0];
  memset(b, 0, (size_t)p->slot);
  memcpy(b + p->param_off, param, p->n * 4);
  if (s->state_dtype == ZS_DTYPE_Q8) {
    /* Quantize both moments together; a missing one is zero. */
    if (m || v) {
      float *zero = NULL;
      if (!m || !v) {
        rc = zs_alloc_aligned((void **)&zero, p->n * 4, 64);
        if (rc < 0) return rc;
        memset(zero, 0, p->n * 4);
      }
      rc = zs_adam_q8_quantize(m ? m : zero, v ? v : zero, p->n,
                               (int8_t *)(b + p->m_off),
                               (float *)(b + p->ms_off),
                               (uint8_t *)(b + p->v_off),
                               (float *)(b + p->vs_off));
      zs_free_aligned(zero);
      if (rc < 0) return zs__fail_prefix(rc, "%s: partition %d", fn, part);
    }
  } else {
    if (p->m_off >= 0) put_state(s->state_dtype, b + p->m_off, m, p->n);
    if (p->v_off >= 0) put_state(s->state_dtype, b + p->v_off, v, p->n);
  }
  return commit_buf0(s, part);
}

int zs_swap_init_partition(zs_swap *s, int part, const float *params) {
  return zs_swap_set_state(s, part, params, NULL, NULL);
}

static int check_ready(const zs_swap *s, int part, const char *fn) {
  if (!s->parts[part].ready)
    return zs__fail(ZS_ESTATE, "%s: partition %d holds no state %s; call "
                    "zs_swap_init_partition, zs_swap_set_state or "
                    "zs_swap_write_image first", fn, part,
                    s->parts[part].dropped ? "(zs_swap_abandon_step dropped "
                    "it: a compact file keeps one image per partition)"
                    : "yet");
  return 0;
}

int zs_swap_get_state(zs_swap *s, int part, float *param, float *m, float *v) {
  const char *fn = "zs_swap_get_state";
  zs__swap_part *p;
  unsigned char *b = NULL;
  int rc;
  if ((rc = check_part(s, part, fn)) < 0) return rc;
  if ((rc = check_state_ptrs(s, fn, m, v)) < 0) return rc;
  if ((rc = check_ready(s, part, fn)) < 0) return rc;
  p = &s->parts[part];
  if ((rc = scratch(s, (void **)&b)) < 0) return rc;
  if ((rc = image_io(s, part, p->loc, b, 0)) < 0) return rc;
  if (param) memcpy(param, b + p->param_off, p->n * 4);
  if (s->state_dtype == ZS_DTYPE_Q8) {
    if (m || v)
      return zs_adam_q8_dequantize(
          m ? (const int8_t *)(b + p->m_off) : NULL,
          m ? (const float *)(b + p->ms_off) : NULL,
          v ? (const uint8_t *)(b + p->v_off) : NULL,
          v ? (const float *)(b + p->vs_off) : NULL, p->n, m, v);
    return 0;
  }
  if (m) get_state(s->state_dtype, m, b + p->m_off, p->n);
  if (v) get_state(s->state_dtype, v, b + p->v_off, p->n);
  return 0;
}

/* The typed arrays a call names must exist for this optimizer and state
 * dtype, and 8-bit codes travel with their block scales. */
static int check_arrays(const zs_swap *s, const char *fn, const void *m,
                        const void *v, const void *ms, const void *vs) {
  int rc = check_state_ptrs(s, fn, m, v);
  if (rc < 0) return rc;
  if (s->state_dtype != ZS_DTYPE_Q8) {
    if (ms || vs)
      return zs__fail(ZS_EINVAL, "%s: m_scale / v_scale exist only for 8-bit "
                      "states; pass NULL", fn);
  } else if (!m != !ms || !v != !vs) {
    return zs__fail(ZS_EINVAL, "%s: 8-bit states need their block scales: "
                    "pass m together with m_scale and v together with "
                    "v_scale (or neither)", fn);
  }
  return 0;
}

/* Where partition part's arrays lie in its image, in the order param, m,
 * v, m_scale, v_scale: offsets (-1 = absent) and sizes in bytes. */
static void array_spans(const zs_swap *s, int part, int64_t off[5],
                        size_t bytes[5]) {
  const zs__swap_part *p = &s->parts[part];
  size_t es = zs__swap_state_es(s->state_dtype);
  size_t qb = zs_optim_qblocks(p->n) * 4;
  off[0] = p->param_off, bytes[0] = p->n * 4;
  off[1] = p->m_off, bytes[1] = p->n * es;
  off[2] = p->v_off, bytes[2] = p->n * es;
  off[3] = p->ms_off, bytes[3] = qb;
  off[4] = p->vs_off, bytes[4] = qb;
}

int zs_swap_read_arrays(zs_swap *s, int part, float *param, void *m, void *v,
                        float *m_scale, float *v_scale) {
  const char *fn = "zs_swap_read_arrays";
  void *dst[5], *b = NULL;
  int64_t off[5];
  size_t bytes[5];
  int i, rc;
  if ((rc = check_part(s, part, fn)) < 0) return rc;
  if ((rc = check_arrays(s, fn, m, v, m_scale, v_scale)) < 0) return rc;
  if ((rc = check_ready(s, part, fn)) < 0) return rc;
  dst[0] = param, dst[1] = m, dst[2] = v, dst[3] = m_scale, dst[4] = v_scale;
  if ((rc = scratch(s, &b)) < 0) return rc;
  if ((rc = image_io(s, part, s->parts[part].loc, b, 0)) < 0) return rc;
  array_spans(s, part, off, bytes);
  for (i = 0; i < 5; i++)
    if (dst[i] && off[i] >= 0)
      memcpy(dst[i], (unsigned char *)b + off[i], bytes[i]);
  return 0;
}

int zs_swap_write_arrays(zs_swap *s, int part, const float *param,
                         const void *m, const void *v, const float *m_scale,
                         const float *v_scale) {
  const char *fn = "zs_swap_write_arrays";
  const void *src[5];
  int64_t off[5];
  size_t bytes[5];
  zs__swap_part *p;
  int i, rc;
  if ((rc = check_part(s, part, fn)) < 0) return rc;
  if ((rc = check_arrays(s, fn, m, v, m_scale, v_scale)) < 0) return rc;
  if ((rc = zs__swap_check_complete(s, fn)) < 0) return rc;
  p = &s->parts[part];
  /* The arrays not named keep their bytes: start from the committed image
   * (or from zeros when the partition holds no state yet). */
  if (p->ready) {
    if ((rc = image_io(s, part, p->loc, s->bufs[0], 0)) < 0) return rc;
  } else {
    memset(s->bufs[0], 0, (size_t)p->slot);
  }
  src[0] = param, src[1] = m, src[2] = v, src[3] = m_scale, src[4] = v_scale;
  array_spans(s, part, off, bytes);
  for (i = 0; i < 5; i++)
    if (src[i] && off[i] >= 0)
      memcpy((unsigned char *)s->bufs[0] + off[i], src[i], bytes[i]);
  return commit_buf0(s, part);
}

int64_t zs_swap_image_bytes(const zs_swap *s, int part) {
  int rc = check_part(s, part, "zs_swap_image_bytes");
  return rc < 0 ? rc : s->parts[part].image;
}

int zs_swap_layout(const zs_swap *s, int part, int64_t *param_off,
                   int64_t *m_off, int64_t *v_off, int64_t *ms_off,
                   int64_t *vs_off, int64_t *total) {
  const zs__swap_part *p;
  int rc = check_part(s, part, "zs_swap_layout");
  if (rc < 0) return rc;
  p = &s->parts[part];
  if (param_off) *param_off = p->param_off;
  if (m_off) *m_off = p->m_off;
  if (v_off) *v_off = p->v_off;
  if (ms_off) *ms_off = p->ms_off;
  if (vs_off) *vs_off = p->vs_off;
  if (total) *total = p->image;
  return 0;
}

int zs_swap_read_image(zs_swap *s, int part, void *buf, int64_t len) {
  const char *fn = "zs_swap_read_image";
  void *b = NULL;
  int rc;
  if ((rc = check_part(s, part, fn)) < 0) return rc;
  if (!buf || len != s->parts[part].image)
    return zs__fail(ZS_EINVAL, "%s: buf must hold exactly %lld bytes "
                    "(zs_swap_image_bytes), got %lld", fn,
                    (long long)s->parts[part].image, (long long)len);
  if ((rc = check_ready(s, part, fn)) < 0) return rc;
  if ((rc = scratch(s, &b)) < 0) return rc;
  if ((rc = image_io(s, part, s->parts[part].loc, b, 0)) < 0) return rc;
  memcpy(buf, b, (size_t)len);
  return 0;
}

int zs_swap_write_image(zs_swap *s, int part, const void *buf, int64_t len) {
  const char *fn = "zs_swap_write_image";
  zs__swap_part *p;
  int rc;
  if ((rc = check_part(s, part, fn)) < 0) return rc;
  if ((rc = zs__swap_check_complete(s, fn)) < 0) return rc;
  p = &s->parts[part];
  if (!buf || len != p->image)
    return zs__fail(ZS_EINVAL, "%s: buf must hold exactly %lld bytes "
                    "(zs_swap_image_bytes), got %lld", fn,
                    (long long)p->image, (long long)len);
  memset(s->bufs[0], 0, (size_t)p->slot);
  memcpy(s->bufs[0], buf, (size_t)len);
  return commit_buf0(s, part);
}
