/* version.c - the library's version, checked by the Python loader. */
#include "zs_internal.h"

unsigned zs_version(void) { return ZS_VERSION_HEX; }

const char *zs_version_string(void) { return ZS_VERSION_STRING; }
