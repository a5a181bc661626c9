"""pytest plugin (opt-in with `-p acc_cpu_ungate`): lift accelerate's `require_non_cpu` gate ("test requires a GPU")
so the in-process Accelerator+DeepSpeed tests of accelerate's tests/deepspeed/ run on a CPU-only machine.
Nothing else changes (`@slow`, `require_multi_device`, `require_fp16`, `require_huggingface_suite` keep their
behaviour). `-p` plugins load before test modules are imported, i.e. before the decorators are applied."""
import accelerate.test_utils.testing as _t


def _identity(test_case):
    return test_case


_t.require_non_cpu = _identity
