"""DeepSpeed's ``deepspeed.launcher.runner``: the names other launchers import from it.

``accelerate launch --use_deepspeed`` imports ``DEEPSPEED_ENVIRONMENT_NAME`` from here before it
starts the ranks (with torchrun on one host); ``main`` is DeepSpeed's ``deepspeed`` command, here
``zspeed launch`` (zspeed/launch.py: its flags, and the ones it refuses by name). DeepSpeed's
runner exports the variables of that file (``.deepspeed_env`` in the home or the current
folder) to the ranks of other hosts when it logs in to them with pdsh or MPI; zspeed launch
logs in to no host (it runs on each one), so it does not read the file: set the variables in
each host's environment.
"""
from __future__ import annotations

import os

__all__ = ["DEEPSPEED_ENVIRONMENT_NAME", "main"]

# DeepSpeed's name of its per-user environment file (the DS_ENV_FILE variable overrides it).
DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")


def main(args=None) -> int:
    """DeepSpeed's ``deepspeed`` command line, run by ``zspeed launch`` (``args``: its arguments,
    default ``sys.argv[1:]``); returns the exit status."""
    from ..launch import main as launch_main
    return launch_main(args)
