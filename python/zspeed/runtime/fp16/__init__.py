"""DeepSpeed's ``deepspeed.runtime.fp16`` package: the loss scaler classes (loss_scaler.py)."""
