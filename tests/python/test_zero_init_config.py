"""zero.Init's config and dtype arguments: read by the engine's own parser (same files, same
messages), with only the fp16/bf16 sections required."""
import json

import pytest

torch = pytest.importorskip("torch")

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError, parse_config  # noqa: E402


def dtype_of(**kw):
    return zspeed.zero.Init(**kw).dtype


def refused(*needles, **kw):
    with pytest.raises(ConfigError) as ei:
        zspeed.zero.Init(**kw)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


def test_the_training_dtype_comes_from_the_precision_sections_without_batch_sizes():
    zero = {"zero_optimization": {"stage": 3}}
    assert dtype_of(config_dict_or_path={"bf16": {"enabled": True}, **zero}) == torch.bfloat16
    assert dtype_of(config={"bfloat16": {"enabled": True}}) == torch.bfloat16
    assert dtype_of(config_dict_or_path={"fp16": {"enabled": True, "loss_scale": 0}}) == torch.float16
    assert dtype_of(config_dict_or_path=zero) == torch.float32
    assert dtype_of() == torch.float16  # DeepSpeed's default without a config
    engine_cfg = parse_config({"train_batch_size": 2, "bf16": {"enabled": True}}, world_size=1)
    assert dtype_of(config_dict_or_path=engine_cfg) == torch.bfloat16


def test_a_section_given_as_true_is_a_config_error_saying_what_to_write():
    refused("config section 'bf16' must be an object", 'Write "bf16": {"enabled": true}',
            config_dict_or_path={"bf16": True})


def test_precision_keys_are_checked_as_the_engine_checks_them():
    refused("unknown config key 'enabeld' in section 'bf16'", "Did you mean 'enabled'?",
            config_dict_or_path={"bf16": {"enabeld": True}})
    refused("fp16.enabled and bf16.enabled are both true",
            config_dict_or_path={"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    refused("'fp16.enabled' = 'yes' has the wrong type", config_dict_or_path={"fp16": {"enabled": "yes"}})


def test_a_missing_file_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "missing.json"
    refused("cannot read the DeepSpeed config file", str(path), "Check the path", config_dict_or_path=str(path))


def test_a_file_with_a_duplicate_key_is_refused(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"bf16": {"enabled": true}, "bf16": {"enabled": false}}')
    refused("the key 'bf16' appears twice", str(path), config_dict_or_path=path)


def test_an_hjson_file_the_engine_reads_gives_the_same_dtype(tmp_path):
    pytest.importorskip("hjson", reason="hjson files are read when the hjson package is installed")
    path = tmp_path / "ds.hjson"
    path.write_text("{\n  // DeepSpeed reads config files as hjson\n  train_batch_size: 2\n"
                    "  bf16: {enabled: true}\n}\n")
    assert parse_config(str(path), world_size=1).bf16_enabled
    assert dtype_of(config_dict_or_path=str(path)) == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.int8, torch.float64, torch.complex64, "bf16"], ids=str)
def test_dtype_must_be_a_training_float(dtype):
    refused(f"zero.Init(dtype={dtype!r})", "torch.float32, torch.float16 or torch.bfloat16", dtype=dtype)


def test_a_config_of_another_type_is_refused():
    refused("got list", config_dict_or_path=[json.dumps({"bf16": {"enabled": True}})])
