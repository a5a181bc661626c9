"""pytest plugin (opt-in with `-p cpu_ungate`): lift transformers' `require_torch_accelerator` gate so the
in-process Trainer+DeepSpeed tests of tests/deepspeed/test_deepspeed.py run on this CPU-only machine.

Nothing else is changed: `@slow`, `require_torch_fp16`, `require_torch_multi_accelerator`, `require_optuna`,
`require_deepspeed_aio` keep their normal behaviour. Must be loaded before the test module is imported
(`-p` plugins are), because the decorators are applied at import time.
"""
import transformers.testing_utils as _tu


def _identity(test_case):
    return test_case


_tu.require_torch_accelerator = _identity
