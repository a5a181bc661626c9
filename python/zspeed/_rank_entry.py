"""One rank of ``zspeed launch``: torchrun starts ``python -m zspeed._rank_entry MODE
TARGET [--local-rank|--no-local-rank] -- ARGS`` and this runs TARGET the way DeepSpeed's
launcher runs a training script: ``TARGET --local_rank=<LOCAL_RANK> ARGS``.

MODE: --script (a Python file, as ``python FILE``), --module (``python -m MODULE``) or
--exec (an executable, replacing this process). A zspeed error (ZSpeedError) that ends TARGET is
written to the launcher's error folder for its agent to print once for every rank
(zspeed._user_errors); ZSPEED_TRACEBACK=1 prints each rank's traceback instead."""
from __future__ import annotations

import os
import runpy
import sys


def main(argv: list) -> None:
    if len(argv) < 3 or argv[0] not in ("--script", "--module", "--exec") or \
            argv[2] not in ("--local-rank", "--no-local-rank"):
        sys.exit("usage: python -m zspeed._rank_entry --script|--module|--exec TARGET "
                 "--local-rank|--no-local-rank -- ARGS (started by zspeed launch)")
    mode, target, lr = argv[0], argv[1], argv[2]
    rest = argv[3:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    extra = [] if lr == "--no-local-rank" else [f"--local_rank={os.environ.get('LOCAL_RANK', '0')}"]
    if mode == "--exec":
        os.execvp(target, [target, *extra, *rest])
    sys.argv = [target, *extra, *rest]
    from ._native import ZSpeedError
    from ._user_errors import install, record
    install()  # a script that never imports zspeed (a deepspeed.py of its own) still gets one line
    try:
        if mode == "--module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except ZSpeedError as e:
        if record(e):  # the agent prints it, once for all ranks
            sys.exit(1)
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
