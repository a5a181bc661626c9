import os
if os.environ.get("ZSPEED_AS_DEEPSPEED", "").strip() not in ("", "0"):
    import zspeed._as_deepspeed  # noqa: F401
