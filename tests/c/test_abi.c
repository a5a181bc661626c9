/* The ABI table (zs_abi_entry): well formed, and complete enough that a
 * field added to a public struct without a row here fails. Python checks
 * its ctypes mirrors against the same table (tests/python/test_native.py). */
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#include "zspeed/aio.h"
#include "zspeed/optim.h"
#include "zspeed/swap.h"
#include "zt.h"

typedef struct {
  int kind;
  const char *scope, *name;
  int64_t value, size;
} row;

/* The whole table; *n gets the row count. */
static row *read_table(int *n) {
  row *rows = NULL;
  int i, cap = 0;
  for (i = 0;; i++) {
    row r;
    if (!zs_abi_entry(i, &r.kind, &r.scope, &r.name, &r.value, &r.size)) break;
    if (i == cap) {
      row *nr = realloc(rows, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *rows);
      if (!nr) {
        free(rows);
        return NULL;
      }
      rows = nr;
    }
    rows[i] = r;
  }
  *n = i;
  return rows;
}

static const row *find(const row *rows, int n, int kind, const char *scope,
                       const char *name) {
  int i;
  for (i = 0; i < n; i++)
    if (rows[i].kind == kind && strcmp(rows[i].scope, scope) == 0 &&
        strcmp(rows[i].name, name) == 0)
      return &rows[i];
  return NULL;
}

/* Every struct's fields follow it, in increasing offsets, without overlap,
 * and cover it: a gap before a field is smaller than that field's own size
 * (alignment padding never reaches it), and the tail padding is smaller
 * than the struct's alignment. A field missing from the table leaves a gap,
 * which fails here unless it could be padding (an int before a double);
 * tests/python/test_native.py also compares the field names with the
 * headers. */
static void structs_are_covered(void) {
  int n = 0, i, structs = 0;
  row *rows = read_table(&n);
  ZT_CHECK(rows != NULL && n > 0);
  for (i = 0; i < n; i++) {
    const row *s = &rows[i];
    int64_t end = 0;
    int j;
    ZT_CHECKF(s->kind >= ZS_ABI_STRUCT && s->kind <= ZS_ABI_CONSTANT,
              "row %d has kind %d", i, s->kind);
    ZT_CHECKF(s->kind != ZS_ABI_FIELD, "field %s.%s does not follow its struct",
              s->scope, s->name);
    if (s->kind != ZS_ABI_STRUCT) continue;
    structs++;
    ZT_CHECK(strcmp(s->scope, s->name) == 0 && s->value > 0 && s->size > 0);
    for (j = i + 1; j < n && rows[j].kind == ZS_ABI_FIELD; j++) {
      const row *f = &rows[j];
      ZT_CHECKF(strcmp(f->scope, s->name) == 0, "field %s.%s follows struct %s",
                f->scope, f->name, s->name);
      ZT_CHECKF(f->size > 0 && f->value >= end && f->value - end < f->size,
                "%s.%s at offset %lld (size %lld) after a field ending at %lld: "
                "a field is missing from the table or out of order", s->name,
                f->name, (long long)f->value, (long long)f->size, (long long)end);
      end = f->value + f->size;
    }
    ZT_CHECKF(j > i + 1, "struct %s has no fields", s->name);
    ZT_CHECKF(end <= s->value && s->value - end < s->size,
              "%s: fields end at %lld of %lld bytes (alignment %lld): a field "
              "is missing from the table", s->name, (long long)end,
              (long long)s->value, (long long)s->size);
    i = j - 1;
  }
  ZT_CHECK(structs == 9);
  free(rows);
}

/* Names are unique within their scope; enum values are distinct within
 * their enum; rows agree with what this test sees of the headers. */
static void names_and_values(void) {
  int n = 0, i, j;
  row *rows = read_table(&n);
  const row *r;
  ZT_CHECK(rows != NULL);
  for (i = 0; i < n; i++) {
    ZT_CHECK(rows[i].scope && rows[i].scope[0] && rows[i].name && rows[i].name[0]);
    for (j = i + 1; j < n; j++) {
      ZT_CHECKF(rows[i].kind != rows[j].kind ||
                    strcmp(rows[i].scope, rows[j].scope) != 0 ||
                    strcmp(rows[i].name, rows[j].name) != 0,
                "%s %s is listed twice", rows[i].scope, rows[i].name);
      if (rows[i].kind == ZS_ABI_ENUM && rows[j].kind == ZS_ABI_ENUM &&
          strcmp(rows[i].scope, rows[j].scope) == 0)
        ZT_CHECKF(rows[i].value != rows[j].value, "%s and %s share a value",
                  rows[i].name, rows[j].name);
    }
  }
  r = find(rows, n, ZS_ABI_ENUM, "zs_aio_backend", "ZS_AIO_BACKEND_IOCP");
  ZT_CHECK(r && r->value == ZS_AIO_BACKEND_IOCP && r->size == sizeof(int));
  r = find(rows, n, ZS_ABI_ENUM, "zs_dtype", "ZS_DTYPE_NONE");
  ZT_CHECK(r && r->value == -1);
  r = find(rows, n, ZS_ABI_CONSTANT, "constant", "ZS_OPTIM_QBLOCK");
  ZT_CHECK(r && r->value == ZS_OPTIM_QBLOCK);
  r = find(rows, n, ZS_ABI_FIELD, "zs_swap_config", "sync_each_step");
  ZT_CHECK(r && r->value == (int64_t)offsetof(zs_swap_config, sync_each_step));
  r = find(rows, n, ZS_ABI_STRUCT, "zs_aio_stats", "zs_aio_stats");
  ZT_CHECK(r && r->value == (int64_t)sizeof(zs_aio_stats));
  free(rows);
}

static void out_of_range(void) {
  int kind = 77;
  const char *name = "untouched";
  int n = 0;
  row *rows = read_table(&n);
  ZT_CHECK(rows != NULL);
  free(rows);
  ZT_CHECK(zs_abi_entry(-1, &kind, NULL, &name, NULL, NULL) == 0);
  ZT_CHECK(zs_abi_entry(n, &kind, NULL, &name, NULL, NULL) == 0);
  ZT_CHECK(kind == 77 && strcmp(name, "untouched") == 0);
  ZT_CHECK(zs_abi_entry(0, NULL, NULL, NULL, NULL, NULL) == 1);
}

ZT_MAIN(ZT_CASE(structs_are_covered), ZT_CASE(names_and_values),
        ZT_CASE(out_of_range))
