"""Ray's ``ray.air.integrations.X`` paths, each the same module as ``dasktune.integration.X``."""
