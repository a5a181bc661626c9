"""``zspeed to-fp32 CKPT OUT`` (DeepSpeed's zero_to_fp32): the fp32 weights of a checkpoint of any
world size (checkpoint.py's layout) as one file, safetensors by default, written atomically and
never into the checkpoint it reads; ``fp32_state_dict`` gives them in memory, and the
``write_*_output`` helpers are the atomic writers the engine's save_16bit_model uses too.
"""
from __future__ import annotations

import json
import logging
import math
import os
import secrets
import stat
import sys
from pathlib import Path

import torch

from .checkpoint_load import _aliases, _open_meta
from .checkpoint_files import _ST_DTYPES, CheckpointError, Deferred, StagingWriter, _Dir, _oserror
from .checkpoint_read import open_for_load
from .checkpoint_shards import PieceReader

__all__ = ["consolidate_fp32", "fp32_state_dict", "main_to_fp32", "write_safetensors_output", "write_text_output",
           "write_torch_output", "write_16bit_model",
           "RECOVERY_SCRIPTS", "write_recovery_scripts", "make_executable"]


# -- zspeed to-fp32 -----------------------------------------------------------------------------
def _checkpoint_root(ckpt, tag) -> tuple[Path, str | None]:
    """(the folder with ``latest``, the tag) for a tag folder itself or a folder with ``latest``."""
    root = Path(ckpt)
    if tag is None and os.path.lexists(root / "manifest.json"):
        return root.parent, root.name
    return root, tag


def _real(p) -> str:
    return os.path.normcase(os.path.realpath(p))


def _within(p: str, folder: str) -> bool:
    return p == folder or p.startswith(folder.rstrip(os.sep) + os.sep)


def _refuse_output_inside(out, outp: Path, root: Path, tag_dir: Path | None) -> None:
    """Refuses (before anything is written) an output that would land in the checkpoint being
    read: the checkpoint folder itself, anything inside one of its folders (a tag, also one
    reached through a symbolic link, a staging folder), or one of its own files (``latest``,
    the lock, zspeed's temporary names). Paths are compared after resolving symbolic links.
    A new file directly in the checkpoint folder, beside the tags, stays allowed."""
    rroot = _real(root)
    folders = [rroot] + ([_real(tag_dir)] if tag_dir is not None else [])
    for given in (out, outp):
        rp = _real(given)
        inside = rp == rroot or any(_within(rp, f) for f in folders[1:])
        if not inside and _within(rp, rroot):
            rel = os.path.relpath(rp, rroot).split(os.sep)
            inside = len(rel) > 1 or rel[0] == "latest" or rel[0].startswith(".zspeed-")
        if inside:
            raise CheckpointError(f"the output '{out}' is inside the checkpoint '{root}' that to-fp32 reads; writing "
                                  f"it there could replace the checkpoint's own files (a tag's model.safetensors, "
                                  f"'latest'). Write the output outside the tag folders, e.g. "
                                  f"'{root.parent / (root.name + '-fp32.safetensors')}'; nothing was written.")


def consolidate_fp32(ckpt: str | os.PathLike, out: str | os.PathLike, tag: str | None = None) -> Path:
    """One safetensors file with every model tensor in fp32 (masters where trained). ``out``
    is a file, or an existing folder (or a path ending in a separator) that receives
    ``model.safetensors``; an output inside the checkpoint read (a tag folder, ``latest``,
    the checkpoint folder itself) is refused before anything is written. The file appears
    complete or not at all."""
    return _consolidate(ckpt, out, tag)[0]


_FROM_ST = {code: dt for dt, code in _ST_DTYPES.items()}


def _fp32_specs(r, src, model) -> dict:
    """name -> Deferred fp32 tensor of an open checkpoint: each trained parameter's master (from
    its pieces), every other tensor (frozen parameters, buffers) from model.safetensors, in
    fp32 where it is floating point."""
    specs: dict = {}
    trained = {n: src.numel(n) for n in src.names()}
    for k in model.keys():
        sl = model.get_slice(k)
        shape, dt = sl.get_shape(), _FROM_ST.get(sl.get_dtype())
        if dt is None:
            raise CheckpointError(f"'{r.path / 'model.safetensors'}': tensor {k} has dtype "
                                  f"{sl.get_dtype()}, which zspeed does not read.")
        n = math.prod(shape)
        if trained.get(k) == n:
            specs[k] = Deferred(torch.float32, shape, lambda k=k, n=n, shape=shape:
                                src.master(k, 0, n).view(shape))
        else:
            to = torch.float32 if dt.is_floating_point else dt
            specs[k] = Deferred(to, shape, lambda k=k, to=to: model.get_tensor(k).to(to).clone())
    for k, n in trained.items():
        if k not in specs and n is not None:
            shape = src.shape(k) or (n,)
            specs[k] = Deferred(torch.float32, shape, lambda k=k, n=n, shape=shape:
                                src.master(k, 0, n).view(shape))
    return specs


def _no_checkpoint(ckpt) -> CheckpointError:
    return CheckpointError(f"no checkpoint at '{ckpt}': expected a tag folder (with manifest.json) or a folder "
                           f"with a 'latest' file.")


def _consolidate(ckpt, out, tag) -> tuple[Path, int]:
    """Streams the output one tensor at a time: each trained parameter's master is read
    (from its pieces, for a checkpoint of several ranks) when its turn to be written comes,
    so memory holds one parameter, never the whole model or any optimizer state."""
    outp = Path(out)
    if outp.is_dir() or str(out).endswith(("/", os.sep)):
        outp = outp / "model.safetensors"
    root, want_tag = _checkpoint_root(ckpt, tag)
    _refuse_output_inside(out, outp, root, None)
    if outp.is_dir():
        raise CheckpointError(f"'{outp}' is a folder; give the output file's name.")
    with open_for_load(root, want_tag) as r:
        if r is None:
            raise _no_checkpoint(ckpt)
        _refuse_output_inside(out, outp, root, r.path)  # the tag read may be a symlink to a folder elsewhere
        where, meta = _open_meta(r)
        aliases = meta.get("model_aliases", {})
        with PieceReader(r, meta, where) as src, r.open_tensors("model.safetensors") as model:
            specs = _fp32_specs(r, src, model)
            _write_output(outp, specs, {"format": "zspeed-fp32", "source": str(r.path),
                                        "aliases": json.dumps(aliases)})
    return outp, sum(t.numel() for t in specs.values())


def fp32_state_dict(ckpt: str | os.PathLike, tag: str | None = None) -> dict:
    """The whole model of a checkpoint as {name: fp32 tensor} in host memory (masters where
    trained; other floating tensors converted to fp32, integer buffers as saved); tied
    weights appear under every name, sharing one tensor. ``ckpt``: a tag folder, or a folder
    with ``latest`` (then ``tag`` picks another tag)."""
    root, want_tag = _checkpoint_root(ckpt, tag)
    with open_for_load(root, want_tag) as r:
        if r is None:
            raise _no_checkpoint(ckpt)
        where, meta = _open_meta(r)
        aliases = _aliases(meta, where)
        with PieceReader(r, meta, where) as src, r.open_tensors("model.safetensors") as model:
            out = {k: d.load() for k, d in _fp32_specs(r, src, model).items()}
    for alias, target in aliases.items():
        if target in out and alias not in out:
            out[alias] = out[target]
    return out


def _write_output(outp: Path, tensors: dict, metadata: dict) -> None:
    """One safetensors file that appears complete or not at all (temporary name, rename)."""
    _atomic_output(outp, lambda d, tmp: StagingWriter(d).write_tensors(tmp, tensors, metadata))


def _write_stream_output(outp: Path, fill) -> None:
    """``fill(file)`` writes the file ``outp``, under the same rules as :func:`_write_output`."""
    def body(d, tmp):
        with os.fdopen(d.create(tmp), "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
    _atomic_output(outp, body)


def write_torch_output(outp: Path, obj) -> None:
    """``torch.save(obj)`` into ``outp`` under the same rules as :func:`_write_output`."""
    _write_stream_output(outp, lambda f: torch.save(obj, f))


def write_safetensors_output(outp: Path, tensors: dict) -> None:
    """A safetensors file of ``tensors`` (each stored once) under the same rules as
    :func:`_write_output`."""
    _write_output(outp, tensors, {"format": "pt"})


def write_text_output(outp: Path, text: str) -> None:
    """A UTF-8 text file under the same rules as :func:`_write_output`."""
    _write_stream_output(outp, lambda f: f.write(text.encode()))


def write_16bit_model(outp: Path, sd: dict) -> None:
    """engine.save_16bit_model's file: safetensors where the name ends in .safetensors (tied
    weights once, their other names as aliases in the metadata), torch.save otherwise, as
    DeepSpeed does; written atomically (see :func:`_atomic_output`)."""
    if outp.name.endswith(".safetensors"):
        from .checkpoint import _dedupe
        out, aliases = _dedupe(sd)  # safetensors refuses shared storage: tied weights once
        _write_output(outp, {k: v.contiguous().cpu() for k, v in out.items()},
                      {"format": "pt", "aliases": json.dumps(aliases)})
    else:
        write_torch_output(outp, {k: v.cpu() for k, v in sd.items()})


# What zspeed writes beside its checkpoints at ZeRO stages 1-3 under DeepSpeed's converters' names
# (zero_to_fp32.py and DeepSpeed 0.19.8's zero_to_torch.py), where DeepSpeed copies its own, so that
# ``python zero_to_fp32.py . out`` works in a checkpoint folder as users know it (it runs zspeed's
# converter: zspeed must be installed).
_SCRIPT = """#!/usr/bin/env python
# Written by zspeed beside its checkpoints, where DeepSpeed writes its {name}:
#   python {name} CHECKPOINT_DIR OUTPUT_DIR {usage}
# writes the whole model into OUTPUT_DIR (pytorch_model.bin, or model.safetensors).
# zspeed's checkpoints are safetensors: this needs zspeed installed (pip install zspeed).
import sys

try:
    from zspeed.utils.{module} import main
except ImportError as e:
    sys.exit(f"{name}: this checkpoint was written by zspeed; install zspeed to convert it ({{e}}).")

if __name__ == "__main__":
    sys.exit(main())
"""
_OPTIONS = "[--safe_serialization] [--max_shard_size 5GB] [-t TAG]"
RECOVERY_SCRIPTS = {
    "zero_to_fp32.py": _SCRIPT.format(name="zero_to_fp32.py", module="zero_to_fp32", usage=_OPTIONS),
    "zero_to_torch.py": _SCRIPT.format(name="zero_to_torch.py", module="zero_to_torch",
                                       usage="--dtype {fp32,fp16,bf16} " + _OPTIONS),
}


def write_recovery_scripts(folder) -> None:
    """:data:`RECOVERY_SCRIPTS` in ``folder`` (beside a ZeRO checkpoint, where DeepSpeed copies
    its converters), made executable. The checkpoint is complete without them: a failure to
    write one is logged, not raised."""
    from .._native import ZSpeedError
    for name, text in RECOVERY_SCRIPTS.items():
        dst = Path(folder) / name
        try:
            write_text_output(dst, text)
        except (ZSpeedError, OSError) as e:
            logging.getLogger("zspeed.engine").warning(
                "zspeed: the checkpoint is saved, but %s could not be written: %s", dst, e)
            continue
        make_executable(str(dst))


def make_executable(dst: str) -> None:
    """Makes a recovery script executable; where the file system refuses (file shares) or the
    file is missing, says so and goes on (DeepSpeed's behaviour)."""
    from .logs import logger
    try:
        os.chmod(dst, os.stat(dst).st_mode | stat.S_IEXEC)
    except (FileNotFoundError, PermissionError) as e:
        logger.info(f"Warning: Could not change permissions for {dst} due to error: {e}. Continuing without "
                    f"changing permissions.")


def _atomic_output(outp: Path, write) -> None:
    """``write(folder, temporary name)`` makes the file, which then replaces ``outp``: the
    temporary file is created exclusively without following a symbolic link (a name planted
    there cannot redirect the write), and ``outp`` appears complete or not at all."""
    try:
        outp.parent.mkdir(parents=True, exist_ok=True)
        d = _Dir.open(outp.parent)
    except OSError as e:
        raise _oserror(e, f"cannot create the output folder '{outp.parent}'") from None
    tmp = f".{outp.name}.zspeed-tmp-{secrets.token_hex(8)}"
    try:
        try:
            st = d.lstat(outp.name)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"cannot write '{outp}': it exists and is not a regular file (a folder, a "
                                  f"symbolic link, a FIFO or a device); remove it or choose another name.")
        write(d, tmp)
        d.replace(tmp, outp.name)
        d.fsync()
    except BaseException as e:
        try:
            d.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _oserror(e, f"cannot write '{outp}'") from None
        raise
    finally:
        d.close()


def main_to_fp32(argv: list[str] | None = None) -> int:
    """``zspeed to-fp32 CKPT OUT [--tag TAG]``: DeepSpeed's zero_to_fp32 for zspeed checkpoints."""
    import argparse
    ap = argparse.ArgumentParser(prog="zspeed to-fp32",
                                 description="Consolidate a zspeed checkpoint's weights (saved by any number "
                                             "of ranks) into one fp32 safetensors file.")
    ap.add_argument("checkpoint", help="checkpoint folder (with 'latest') or one tag folder")
    ap.add_argument("output", help="output .safetensors file, or a folder that receives model.safetensors "
                                   "(not inside the checkpoint's tag folders, nor 'latest')")
    ap.add_argument("--tag", default=None, help="tag to read (default: the one in 'latest')")
    a = ap.parse_args(argv)
    try:
        out, count = _consolidate(a.checkpoint, a.output, a.tag)
    except CheckpointError as e:
        print(f"zspeed to-fp32: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({count} values)")
    return 0
