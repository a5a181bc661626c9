"""ctypes signatures of libzspeed's exported functions, one module per area.

Each module defines ``SIGNATURES = {name: (restype, [argtypes...])}``;
``zspeed._native`` applies every table when it loads the library, and fails
clearly if the library lacks a declared function.
"""
