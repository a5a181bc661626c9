"""zspeed's training runtime: DeepSpeed's config, engine, precision, schedules,
offload and checkpoints, on top of torch (>= 2.1) and libzspeed."""
