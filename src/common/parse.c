/* parse.c - the one strict number parser of the library's text inputs:
 * environment variables (ZSPEED_NUM_THREADS) and the native command's
 * options. The whole string must be the number: no leading blanks, no
 * trailing characters, no nan or inf, no wrap-around; a value outside the
 * caller's range is refused with the range, never clamped or replaced. */
#include <stdio.h>
#include <string.h>

#include "zs_internal.h"

static int digit(char c) { return c >= '0' && c <= '9'; }

/* Accumulates decimal digits at *p into *v (>= 0); 1 on overflow of
 * INT64_MAX, 0 otherwise; *p is left after the digits. */
static int digits(const char **p, int64_t *v, int *count) {
  int over = 0;
  *v = 0;
  *count = 0;
  for (; digit(**p); (*p)++, (*count)++) {
    int d = **p - '0';
    if (*v > (INT64_MAX - d) / 10) over = 1;
    else *v = *v * 10 + d;
  }
  return over;
}

static int out_of_range(const char *s, int64_t lo, int64_t hi) {
  return zs__fail(ZS_ERANGE, "'%s' is out of range: give a value in [%lld, "
                  "%lld]", s, (long long)lo, (long long)hi);
}

int zs__parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  const char *p = s;
  int neg = 0, n, over;
  int64_t v;
  if (!s || !out) return zs__fail(ZS_EINVAL, "zs__parse_int: NULL argument");
  if (*p == '-' || *p == '+') neg = *p++ == '-';
  over = digits(&p, &v, &n);
  if (n == 0 || *p)
    return zs__fail(ZS_EINVAL, "'%s' is not an integer", s);
  if (over) return out_of_range(s, lo, hi);
  if (neg) v = -v;
  if (v < lo || v > hi) return out_of_range(s, lo, hi);
  *out = v;
  return 0;
}

/* Multiplier of a binary unit suffix (K, M, G, T, each optionally followed
 * by "i", "B" or "iB", and "B" alone), or 0 for an unknown one. */
static int64_t unit(const char **p) {
  int64_t mul = 1;
  switch (**p) {
    case 'k': case 'K': mul = (int64_t)1 << 10; break;
    case 'm': case 'M': mul = (int64_t)1 << 20; break;
    case 'g': case 'G': mul = (int64_t)1 << 30; break;
    case 't': case 'T': mul = (int64_t)1 << 40; break;
    case 'b': case 'B': (*p)++; return **p ? 0 : 1;
    case '\0': return 1;
    default: return 0;
  }
  (*p)++;
  if (**p == 'i') (*p)++;
  if (**p == 'B' || **p == 'b') (*p)++;
  return **p ? 0 : mul;
}

int zs__parse_size(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  const char *p = s;
  int64_t whole, frac = 0, scale = 1, mul, v;
  int n, nfrac = 0, over;
  if (!s || !out) return zs__fail(ZS_EINVAL, "zs__parse_size: NULL argument");
  if (p[0] == '2' && p[1] == '^') { /* 2^k */
    p += 2;
    over = digits(&p, &whole, &n);
    if (n == 0 || *p) return zs__fail(ZS_EINVAL, "'%s' is not a size", s);
    if (over || whole > 62) return out_of_range(s, lo, hi);
    v = (int64_t)1 << whole;
    if (v < lo || v > hi) return out_of_range(s, lo, hi);
    *out = v;
    return 0;
  }
  over = digits(&p, &whole, &n);
  if (*p == '.') {
    p++;
    for (; digit(*p); p++, nfrac++) {
      if (nfrac == 9)
        return zs__fail(ZS_EINVAL, "'%s' has more than 9 decimals", s);
      frac = frac * 10 + (*p - '0');
      scale *= 10;
    }
  }
  if (n == 0 && nfrac == 0)
    return zs__fail(ZS_EINVAL, "'%s' is not a size (e.g. 4096, 64K, 1.5G, "
                    "2^20)", s);
  mul = unit(&p);
  if (mul == 0)
    return zs__fail(ZS_EINVAL, "'%s' is not a size: unknown unit (use K, M, "
                    "G or T, powers of 1024)", s);
  if (over || whole > INT64_MAX / mul) return out_of_range(s, lo, hi);
  v = whole * mul;
  if (frac) {
    /* frac / scale of a unit must be a whole number of bytes; mul and
     * scale are at most 2^40 and 1e9, so frac * mul fits in 128 bits but
     * not 64: divide first where exact. */
    int64_t g = mul, t = scale, r;
    while (t) { r = g % t; g = t; t = r; } /* gcd(mul, scale) */
    if ((frac % (scale / g)) != 0)
      return zs__fail(ZS_EINVAL, "'%s' is not a whole number of bytes", s);
    frac = frac / (scale / g) * (mul / g);
    if (v > INT64_MAX - frac) return out_of_range(s, lo, hi);
    v += frac;
  }
  if (v < lo || v > hi) return out_of_range(s, lo, hi);
  *out = v;
  return 0;
}
