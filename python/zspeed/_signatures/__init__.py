"""ctypes signatures of libzspeed's exported functions, one module per area.

Each module defines ``SIGNATURES = {name: (restype, [argtypes...])}``;
``zspeed._native`` applies every table when it loads the library, and fails
clearly if the library lacks a declared function.

The modules are also the one place where the C headers' structs, enums and
constants are copied: ``STRUCTS`` maps a C struct tag to its ctypes mirror,
``ENUMS`` a C enum tag to ``(Python enum, C name prefix)`` and ``CONSTANTS``
a C macro name to its value. The rest of the package imports them from here,
and tests/python/test_native.py checks every entry against the library's own
table (``zs_abi_entry``): sizes, alignments, field offsets, enum values.
"""
