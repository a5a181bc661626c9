"""pytest plugin (opt-in with `-p cpu_bf16`, CPU smoke runs only, never on the GPU): transformers' TrainingArguments
refuses `bf16=True` without a GPU unless `use_cpu=True`; make its bf16-GPU check return True."""
import transformers.training_args as _ta

_ta.is_torch_bf16_gpu_available = lambda: True
