"""DeepSpeed's ``deepspeed.utils.zero_to_fp32`` for zspeed checkpoints: the whole model in fp32
from a checkpoint of any stage and world size (the masters where trained), as a state dict,
into a model, or as files. The command line does the same: ``zspeed to-fp32`` (streaming one
tensor at a time, so it also fits models larger than memory).

``convert_zero_checkpoint_to_state_dict`` writes the same weights in fp32, fp16 or bf16
(``dtype``; DeepSpeed 0.19.8's, with its ``zero_to_torch.py`` command line: see
``zspeed.utils.zero_to_torch``).

``checkpoint_dir`` is the folder that holds ``latest`` and the tag folders (``tag`` picks one;
default: the tag ``latest`` names), or a tag folder itself. What differs from DeepSpeed:
``exclude_frozen_parameters=True`` is refused (a zspeed checkpoint does not record which of
the tensors nothing trains are parameters and which are buffers), and ``lazy_mode=True``
returns ordinary tensors (each still answers ``.contiguous()``)."""
from __future__ import annotations

import json
import re

import torch

__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "load_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_state_dict", "convert_zero_checkpoint_to_fp32_state_dict",
           "OUTPUT_DTYPE_NAMES", "main", "run_converter", "RECOVERY_SCRIPTS",
           "write_recovery_scripts", "make_executable"]

# The output dtypes DeepSpeed's converter takes, by the names it takes (any letter case).
OUTPUT_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
                      "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def _no_frozen_exclusion(exclude_frozen_parameters) -> None:
    if exclude_frozen_parameters:
        raise ValueError("exclude_frozen_parameters=True: a zspeed checkpoint does not record which untrained "
                         "tensors are parameters and which are buffers, so it cannot leave out only the frozen "
                         "parameters; convert everything (the default) and drop the names you do not want.")


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False,
                                             lazy_mode=False) -> dict:
    """{name: fp32 tensor} of the whole model in host memory (integer buffers keep their dtype;
    tied weights appear under each name). ``lazy_mode`` is accepted and returns the same."""
    del lazy_mode
    _no_frozen_exclusion(exclude_frozen_parameters)
    from ..runtime.checkpoint_fp32 import fp32_state_dict
    return fp32_state_dict(checkpoint_dir, tag)


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """DeepSpeed's: moves ``model`` to the CPU, loads the checkpoint's fp32 weights into it
    (``strict=False``, as DeepSpeed) and returns it; the model is then an ordinary torch model
    (build a new engine to train it with zspeed again)."""
    state_dict = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state_dict, strict=False)
    return model


def _shard_bytes(max_shard_size) -> int:
    """The largest shard in bytes; None: no limit (one file), as DeepSpeed."""
    if max_shard_size is None:
        return 0
    if isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool):
        n = max_shard_size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(max_shard_size).upper())
        if m is None or m.group(2) not in _UNITS:
            raise ValueError(f"max_shard_size={max_shard_size!r}: give bytes (an integer) or a size such as "
                             f"'5GB' or '500MB' (None: one file).")
        n = int(float(m.group(1)) * _UNITS[m.group(2)])
    if n <= 0:
        raise ValueError(f"max_shard_size={max_shard_size!r} must be positive (None: one file).")
    return n


def _output_dtype(dtype):
    """The torch dtype a converter writes floating-point tensors in: a torch dtype or one of
    OUTPUT_DTYPE_NAMES (any letter case); anything else is DeepSpeed's ValueError."""
    got = OUTPUT_DTYPE_NAMES.get(dtype.lower()) if isinstance(dtype, str) else dtype
    if got not in OUTPUT_DTYPE_NAMES.values():
        raise ValueError(f"Unsupported output dtype {dtype!r}. Choose one of: {', '.join(sorted(OUTPUT_DTYPE_NAMES))}")
    return got


def convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, dtype="float32", max_shard_size="5GB",
                                          safe_serialization=False, tag=None, exclude_frozen_parameters=False):
    """DeepSpeed's: writes the model into ``output_dir`` (created if needed) with its
    floating-point tensors in ``dtype`` (float32, float16 or bfloat16, as a torch dtype or one of
    OUTPUT_DTYPE_NAMES; other tensors keep theirs), as ``pytorch_model.bin`` (torch.save) or,
    with ``safe_serialization``, ``model.safetensors``; a model above ``max_shard_size`` (bytes in
    the output dtype; None: never) is cut into Hugging Face's numbered shards
    (``model-00001-of-00003.safetensors``, ...) with their ``.index.json``. Tied weights are
    kept under each name in the torch file and stored once in safetensors (which cannot hold
    shared tensors; the model ties them again on load). Each file appears complete or not at
    all. Returns the list of files written (DeepSpeed returns None)."""
    _no_frozen_exclusion(exclude_frozen_parameters)
    out_dtype = _output_dtype(dtype)
    limit = _shard_bytes(max_shard_size)
    from pathlib import Path

    from ..runtime.checkpoint_fp32 import fp32_state_dict, write_safetensors_output, write_text_output, write_torch_output
    sd = fp32_state_dict(checkpoint_dir, tag)
    out = Path(output_dir)  # created by the first write
    shards, cur, size, total = [], {}, 0, 0
    seen: dict = {}
    for name, t in sd.items():  # tied names stay in the shard of the tensor they share
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        if key in seen:  # a tied name: torch.save keeps the sharing; safetensors stores the tensor once
            if not safe_serialization:
                seen[key][name] = t
            continue
        n = t.numel() * (out_dtype.itemsize if t.is_floating_point() else t.element_size())
        if cur and limit and size + n > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        seen[key] = cur
        size += n
        total += n
    shards.append(cur)
    stem, ext = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    names = [f"{stem}{ext}"] if len(shards) == 1 else \
        [f"{stem}-{i + 1:05d}-of-{len(shards):05d}{ext}" for i in range(len(shards))]
    written = []
    for fname, shard in zip(names, shards):
        cast: dict = {}  # one cast per tensor, so tied names stay one tensor in the torch file
        shard = {k: cast.setdefault(id(t), t.to(out_dtype) if t.is_floating_point() else t)
                 for k, t in shard.items()}
        if safe_serialization:
            write_safetensors_output(out / fname, shard)
        else:
            write_torch_output(out / fname, shard)
        written.append(out / fname)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: fname for fname, shard in zip(names, shards) for k in shard}}
        idx = out / f"{stem}{ext}.index.json"
        write_text_output(idx, json.dumps(index, indent=2) + "\n")
        written.append(idx)
    return [str(p) for p in written]


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization=False, tag=None, exclude_frozen_parameters=False):
    """DeepSpeed's: ``convert_zero_checkpoint_to_state_dict`` in float32."""
    return convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, "float32", max_shard_size,
                                                 safe_serialization, tag, exclude_frozen_parameters)


from ..runtime.checkpoint_fp32 import RECOVERY_SCRIPTS, make_executable, write_recovery_scripts  # noqa: E402,F401


def run_converter(prog: str, argv=None, with_dtype: bool = False) -> int:
    """DeepSpeed's converter command lines (zero_to_fp32.py; zero_to_torch.py with ``--dtype``,
    required as in DeepSpeed): ``CHECKPOINT_DIR OUTPUT_DIR`` with ``--max_shard_size``,
    ``--safe_serialization``, ``-t/--tag``, ``--exclude_frozen_parameters`` (refused, see the
    module docstring) and ``-d/--debug``; returns the exit status (0, or 1 with the reason on
    stderr)."""
    import argparse
    import sys
    what = "in float32, float16 or bfloat16" if with_dtype else "in fp32 (also `zspeed to-fp32`)"
    parser = argparse.ArgumentParser(
        prog=prog, description=f"Writes the whole model of a zspeed checkpoint {what}; DeepSpeed's {prog}.")
    parser.add_argument("checkpoint_dir", help="the checkpoint folder (holding 'latest' and the tag folders)")
    parser.add_argument("output_dir", help="the folder the state dict files go into")
    if with_dtype:
        parser.add_argument("--dtype", required=True, choices=sorted(OUTPUT_DTYPE_NAMES),
                            help="the dtype of the floating-point tensors written")
    parser.add_argument("--max_shard_size", default="5GB", help="largest file before the model is sharded")
    parser.add_argument("--safe_serialization", action="store_true", help="write safetensors files")
    parser.add_argument("-t", "--tag", default=None, help="the tag to convert (default: the one 'latest' names)")
    parser.add_argument("--exclude_frozen_parameters", action="store_true", help="(refused by zspeed)")
    parser.add_argument("-d", "--debug", action="store_true", help="accepted (no effect)")
    args = parser.parse_args(argv)
    from .._native import ZSpeedError
    try:
        written = convert_zero_checkpoint_to_state_dict(
            args.checkpoint_dir, args.output_dir, dtype=args.dtype if with_dtype else "float32",
            max_shard_size=args.max_shard_size, safe_serialization=args.safe_serialization, tag=args.tag,
            exclude_frozen_parameters=args.exclude_frozen_parameters)
    except (ZSpeedError, ValueError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def main(argv=None) -> int:
    """DeepSpeed's zero_to_fp32.py command line (see run_converter)."""
    return run_converter("zero_to_fp32.py", argv)


if __name__ == "__main__":
    raise SystemExit(main())
