"""Torch-facing operators (optimizers, async I/O). Importing this package
imports nothing heavy: each submodule loads torch only when a tensor is
actually used."""
