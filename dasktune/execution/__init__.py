"""Ray's ``ray.tune.execution`` paths, for translated imports."""
