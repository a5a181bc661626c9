/* fault.c - test-only fault injection. A handful of named sites; arming one
 * makes the nth call that reaches it fail with a chosen error. When nothing is
 * armed, zs__fault_check costs one relaxed atomic load. */
#include <string.h>

#include "zs_internal.h"

#define ZS__FAULT_SLOTS 16
#define ZS__FAULT_NAME 48

typedef struct {
  char site[ZS__FAULT_NAME];
  int64_t remaining; /* calls still to pass before failing */
  int64_t count;     /* how many consecutive calls fail */
  int err;
} zs__fault_slot;

static zs__mutex zs__fault_mu;
static zs__once_t zs__fault_once = ZS__ONCE_INIT;
static zs__fault_slot zs__faults[ZS__FAULT_SLOTS];
static volatile int32_t zs__faults_armed;

static void zs__fault_init(void) { zs__mutex_init(&zs__fault_mu); }

int zs_fault_set(const char *site, int n, int count, int err) {
  size_t i, free_slot = ZS__FAULT_SLOTS;
  if (site == NULL || strlen(site) >= ZS__FAULT_NAME || n < 0)
    return zs__fail(ZS_EINVAL, "zs_fault_set: site must be a name shorter "
                               "than %d characters and n >= 0",
                    ZS__FAULT_NAME);
  if (n > 0 && err >= 0)
    return zs__fail(ZS_EINVAL, "zs_fault_set: err must be a negative ZS_E* "
                               "code, got %d", err);
  zs__call_once(&zs__fault_once, zs__fault_init);
  zs__mutex_lock(&zs__fault_mu);
  for (i = 0; i < ZS__FAULT_SLOTS; i++) {
    if (zs__faults[i].site[0] && strcmp(zs__faults[i].site, site) == 0) {
      free_slot = i;
      break;
    }
    if (!zs__faults[i].site[0] && free_slot == ZS__FAULT_SLOTS) free_slot = i;
  }
  if (free_slot == ZS__FAULT_SLOTS) {
    zs__mutex_unlock(&zs__fault_mu);
    return zs__fail(ZS_ENOMEM, "zs_fault_set: all %d fault slots are armed",
                    ZS__FAULT_SLOTS);
  }
  if (n == 0) {
    if (zs__faults[free_slot].site[0]) zs__atomic_add32(&zs__faults_armed, -1);
    memset(&zs__faults[free_slot], 0, sizeof zs__faults[free_slot]);
  } else {
    if (!zs__faults[free_slot].site[0]) zs__atomic_add32(&zs__faults_armed, 1);
    strcpy(zs__faults[free_slot].site, site);
    zs__faults[free_slot].remaining = n - 1;
    zs__faults[free_slot].count = count > 0 ? count : 1;
    zs__faults[free_slot].err = err;
  }
  zs__mutex_unlock(&zs__fault_mu);
  return 0;
}

void zs_fault_clear(void) {
  zs__call_once(&zs__fault_once, zs__fault_init);
  zs__mutex_lock(&zs__fault_mu);
  memset(zs__faults, 0, sizeof zs__faults);
  zs__atomic_store32(&zs__faults_armed, 0);
  zs__mutex_unlock(&zs__fault_mu);
}

int zs__fault_check(const char *site) {
  int err = 0;
  size_t i;
  if (ZS_LIKELY(zs__atomic_load32(&zs__faults_armed) == 0)) return 0;
  zs__mutex_lock(&zs__fault_mu);
  for (i = 0; i < ZS__FAULT_SLOTS; i++) {
    zs__fault_slot *s = &zs__faults[i];
    if (!s->site[0] || strcmp(s->site, site) != 0) continue;
    if (s->remaining > 0) {
      s->remaining--;
    } else if (s->count > 0) {
      err = s->err;
      if (--s->count == 0) {
        memset(s, 0, sizeof *s);
        zs__atomic_add32(&zs__faults_armed, -1);
      }
    }
    break;
  }
  zs__mutex_unlock(&zs__fault_mu);
  if (err) zs__fail(err, "injected fault at '%s'", site);
  return err;
}
