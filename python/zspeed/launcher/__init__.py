"""DeepSpeed's ``deepspeed.launcher`` package: ``runner`` (the names launchers import from it).
zspeed's launcher itself is ``zspeed launch`` (zspeed/launch.py)."""
