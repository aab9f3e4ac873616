"""Framework integrations, at Ray Tune's paths (``ray.tune.integration.X`` and
``ray.air.integrations.X`` are both ``dasktune.integration.X``).

Each submodule imports its library when it is imported and says which pip extra
installs it when it is missing:

- :mod:`~dasktune.integration.xgboost`, :mod:`~dasktune.integration.lightgbm`: training
  callbacks that report each round's eval metrics and checkpoint the booster.
- :mod:`~dasktune.integration.pytorch_lightning` (also ``lightning``),
  :mod:`~dasktune.integration.keras`: the same for those trainers.
- :mod:`~dasktune.integration.mlflow`, :mod:`~dasktune.integration.wandb`: a logger
  callback on the driver, and ``setup_*`` inside a trial.
"""
