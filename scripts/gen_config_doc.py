"""Writes docs/CONFIG.md from the config schema (python/zspeed/runtime/config_schema.py).

    python scripts/gen_config_doc.py            # rewrite docs/CONFIG.md
    python scripts/gen_config_doc.py --check    # exit 1 if it is out of date
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

from zspeed.runtime.config import schema_rows  # noqa: E402
from zspeed.runtime.plan import combinations_table  # noqa: E402

HEADER = """# Supported DeepSpeed config keys

Generated from the schema in `python/zspeed/runtime/config_schema.py` by
`scripts/gen_config_doc.py` (a test checks it is current). Keys have
DeepSpeed's names, defaults and meaning. Any other key is an error that names
the key, its section and the closest known key; zspeed needs no
platform-specific keys (such as the "windows_specific" keys some guides
invent). HF accelerate's "auto" values are resolved where they can be and
refused clearly otherwise. Files are read as DeepSpeed reads them (JSON, or
hjson when the `hjson` package is installed), refusing duplicate keys,
NaN/Infinity and integers longer than Python converts (4300 digits by default;
the error names the key). `zero.Init(config_dict_or_path=...)` reads its config
the same way and checks only the `fp16`/`bf16` sections (no batch sizes needed).

| key | type | default | meaning |
| --- | --- | --- | --- |
"""


COMBINATIONS = """
## Combinations

Which settings combine with what, from the run plan's table (`python/zspeed/runtime/plan.py`,
`FEATURES`): the same rows write every refusal of a combination, so this table and the
errors cannot disagree. "any": the row puts no condition there.

"""


def render() -> str:
    lines = [HEADER]
    for key, typ, default, meaning in schema_rows():
        d = "" if default is None else f"`{default!r}`"
        lines.append(f"| `{key}` | {typ.replace('|', ' or ')} | {d} | {meaning} |\n")
    lines.append(COMBINATIONS)
    lines.append(combinations_table())
    return "".join(lines)


def main(argv):
    out = ROOT / "docs" / "CONFIG.md"
    text = render()
    if "--check" in argv:
        if not out.exists() or out.read_text() != text:
            print("docs/CONFIG.md is out of date: run python scripts/gen_config_doc.py")
            return 1
        return 0
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
