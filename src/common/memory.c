/* memory.c - aligned and page-locked allocation (zspeed.h): the argument
 * checks and size rounding every platform shares. Mapping, locking and the
 * page-lock limit are in memory_posix.c and memory_win.c. */
#include "zs_os.h"

static int zs__is_pow2(size_t x) { return x && !(x & (x - 1)); }

int zs_alloc_aligned(void **out, size_t size, size_t align) {
  void *p;
  if (!out) return zs__fail(ZS_EINVAL, "zs_alloc_aligned: out is NULL");
  if (!zs__is_pow2(align) || align < sizeof(void *))
    return zs__fail(ZS_EINVAL,
                    "zs_alloc_aligned: align must be a power of two >= %u, "
                    "got %zu",
                    (unsigned)sizeof(void *), align);
  if (size == 0) size = align; /* a unique, freeable pointer */
  /* Some allocators (msvcrt's _aligned_malloc under Wine) overflow
   * size + align silently: refuse impossible sizes ourselves. */
  if (size > SIZE_MAX - 2 * align ||
      (p = zs__os_aligned_alloc(size, align)) == NULL)
    return zs__fail(ZS_ENOMEM, "cannot allocate %zu bytes aligned to %zu",
                    size, align);
  *out = p;
  return 0;
}

void zs_free_aligned(void *p) { zs__os_aligned_free(p); }

/* Whole pages covering size bytes (one page for size 0). */
static size_t zs__pin_len(size_t size, size_t page) {
  return size ? (size + page - 1) / page * page : page;
}

int zs_alloc_pinned(void **out, size_t size, unsigned flags, int *locked) {
  size_t page = zs__os_page_size();
  if (!out) return zs__fail(ZS_EINVAL, "zs_alloc_pinned: out is NULL");
  if (flags & ~(unsigned)ZS_PIN_FALLBACK)
    return zs__fail(ZS_EINVAL, "zs_alloc_pinned: unknown flags 0x%x", flags);
  if (size > SIZE_MAX - page)
    return zs__fail(ZS_ENOMEM, "zs_alloc_pinned: size %zu too large", size);
  return zs__os_pin(out, zs__pin_len(size, page), flags, locked);
}

void zs_free_pinned(void *p, size_t size) {
  if (!p) return;
  zs__os_unpin(p, zs__pin_len(size, zs__os_page_size()));
}

int zs_advise_huge_pages(void *p, size_t size) {
  size_t page = zs__os_page_size();
  uintptr_t lo, hi;
  if (!p) return zs__fail(ZS_EINVAL, "zs_advise_huge_pages: p is NULL");
  lo = ((uintptr_t)p + page - 1) / page * page;   /* the whole pages inside */
  hi = ((uintptr_t)p + size) / page * page;
  if (size > UINTPTR_MAX - (uintptr_t)p || hi <= lo) return 0; /* none: nothing to advise */
  return zs__os_advise_huge((void *)lo, (size_t)(hi - lo));
}
