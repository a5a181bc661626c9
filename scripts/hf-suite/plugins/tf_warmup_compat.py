"""pytest plugin (opt-in with `-p tf_warmup_compat`): backport of transformers' own fix (in 5.25, not in 5.17)
to `HfTrainerDeepSpeedConfig.trainer_config_finalize`, which fills an `auto` `scheduler.params.warmup_num_steps`
with `max(1, args.get_warmup_steps(...))` instead of `args.get_warmup_steps(...)`. DeepSpeed >= 0.19.6 (and zspeed,
which follows it) rejects warmup_num_steps 0 ("warmup_num_steps must be a positive integer, got 0"), so with
transformers 5.17 every Trainer test whose config has WarmupLR/WarmupDecayLR and warmup_steps=0 fails on both
sides. Does nothing when the installed transformers already has the fix."""
import inspect

from transformers.integrations import deepspeed as _d

_cls = _d.HfTrainerDeepSpeedConfig
APPLIED = "max(1, args.get_warmup_steps" not in inspect.getsource(_cls.trainer_config_finalize)
if APPLIED:
    _orig_fill_match = _cls.fill_match

    def fill_match(self, ds_key_long, hf_val, hf_key=None, must_match=True):
        if ds_key_long == "scheduler.params.warmup_num_steps" and isinstance(hf_val, int):
            hf_val = max(1, hf_val)
        return _orig_fill_match(self, ds_key_long, hf_val, hf_key, must_match)

    _cls.fill_match = fill_match


def pytest_report_header(config):
    return f"tf_warmup_compat: {'applied (transformers lacks the max(1, ...) fix)' if APPLIED else 'not needed'}"
