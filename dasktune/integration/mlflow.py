"""MLflow tracking: :class:`MLflowLoggerCallback` logs every trial as an MLflow run from
the driver; :func:`setup_mlflow` opens a run inside a trial for the user's own logging
(Ray's ``ray.air.integrations.mlflow``, same names and arguments).

Differences from Ray 2.60, each so that it works on a fresh MLflow 3 store:

- Without an experiment named anywhere (argument, ``config["mlflow"]``,
  ``MLFLOW_EXPERIMENT_ID``/``MLFLOW_EXPERIMENT_NAME``), runs go to an MLflow experiment
  named after the Tune experiment, created when missing. Ray defaults to the trial's
  ID and name, which no store has (MLflow experiment IDs are integers), so
  ``setup_mlflow(config)`` fails there.
- ``setup_mlflow`` reads the ``config["mlflow"]`` settings Ray's own example passes
  (and does not log them as parameters); arguments take precedence.
- ``setup_mlflow``'s run ends with the trial's attempt (``FAILED`` if it raised), not
  at the worker process's exit, which for a Dask worker can be hours later.
- The callback's MLflow calls run on a thread of their own (metrics batched per
  driver step with ``log_batch``), not in the driver's loop.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import urllib.parse
from types import ModuleType
from typing import TYPE_CHECKING, Any

try:
    import mlflow
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('dasktune.integration.mlflow needs MLflow: '
                      'pip install "dasktune[mlflow]"') from exc

from dasktune.integration._background import BackgroundLogger
from dasktune.logger import flatten_dict
from dasktune.session import at_attempt_end, get_context

if TYPE_CHECKING:
    from dasktune.trial import Trial

_BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics and 100 params a call
_PARAM_BATCH = 100


def _experiment_id(client: MlflowClient, experiment_id: str | None,
                   experiment_name: str | None, artifact_location: str | None,
                   create: bool) -> str:
    """The ID of the experiment to log to: ``experiment_id`` if it exists, else the one
    named ``experiment_name`` (created when ``create``). Errors name what is missing."""
    if experiment_id is not None:
        try:
            return client.get_experiment(str(experiment_id)).experiment_id
        except MlflowException:
            if experiment_name is None:
                raise ValueError(f"MLflow experiment id {experiment_id!r} does not exist "
                                 "and no experiment_name was given") from None
    if experiment_name is None:
        raise ValueError("no MLflow experiment: pass experiment_id or experiment_name")
    found = client.get_experiment_by_name(experiment_name)
    if found is not None:
        return found.experiment_id
    if not create:
        raise ValueError(f"MLflow experiment {experiment_name!r} does not exist; create it "
                         "or pass create_experiment_if_not_exists=True")
    try:
        return client.create_experiment(experiment_name, artifact_location=artifact_location)
    except MlflowException:  # another trial created it first
        found = client.get_experiment_by_name(experiment_name)
        if found is None:
            raise
        return found.experiment_id


def _check_reachable(tracking_uri: str | None) -> None:
    """Fail at once, naming the server, when an HTTP tracking URI accepts no connection
    (MLflow's own client retries for minutes before it gives up)."""
    if not tracking_uri or not tracking_uri.startswith(("http://", "https://")):
        return
    url = urllib.parse.urlsplit(tracking_uri)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=10).close()
    except OSError as exc:
        raise ConnectionError(f"MLflow tracking server {tracking_uri} is not reachable: "
                              f"{exc}") from None


def _params(config: dict[str, Any]) -> dict[str, str]:
    """A config as MLflow parameters: flattened ``a/b``, values as text."""
    return {k: str(v) for k, v in flatten_dict(config).items()}


def _metrics(result: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a result, flattened (Ray logs what ``float`` takes)."""
    out = {}
    for key, value in flatten_dict({k: v for k, v in result.items() if k != "config"}).items():
        if isinstance(value, str):
            continue  # "date", "trial_id", ...: text, even when it reads as a number
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def setup_mlflow(config: dict[str, Any] | None = None, tracking_uri: str | None = None,
                 registry_uri: str | None = None, experiment_id: str | None = None,
                 experiment_name: str | None = None, tracking_token: str | None = None,
                 artifact_location: str | None = None, run_name: str | None = None,
                 create_experiment_if_not_exists: bool = False,
                 tags: dict[str, Any] | None = None,
                 rank_zero_only: bool = True) -> ModuleType:
    """Start an MLflow run for this trial and return the ``mlflow`` module.

    Call it inside a trainable; then use ``mlflow.log_metric(...)`` etc. as usual. The
    trial's ``config`` (less its ``"mlflow"`` entry) is logged as the run's parameters.
    Settings missing from the arguments are read from ``config["mlflow"]`` (same
    names), then MLflow's environment variables. Without any experiment named, the run
    goes to an experiment named after the Tune experiment, created if missing; an
    experiment named but missing is an error unless ``create_experiment_if_not_exists``.
    The run is named ``run_name``, else after the trial, and ends with the trial's
    attempt. ``rank_zero_only`` is accepted for Ray compatibility (trials have one
    worker, rank 0).
    """
    del rank_zero_only
    config = dict(config or {})
    settings = config.pop("mlflow", None) or {}
    if not isinstance(settings, dict):
        raise TypeError(f'config["mlflow"] must be a dict of settings, got {settings!r}')
    tracking_uri = tracking_uri or settings.get("tracking_uri")
    registry_uri = registry_uri or settings.get("registry_uri")
    tracking_token = tracking_token or settings.get("token") or settings.get("tracking_token")
    experiment_id = experiment_id or settings.get("experiment_id") or \
        os.environ.get("MLFLOW_EXPERIMENT_ID")
    experiment_name = experiment_name or settings.get("experiment_name") or \
        os.environ.get("MLFLOW_EXPERIMENT_NAME")
    create = create_experiment_if_not_exists or bool(settings.get(
        "create_experiment_if_not_exists", False))
    context = get_context()
    in_trial = True
    try:
        trial_name = context.get_trial_name()
    except RuntimeError:
        in_trial, trial_name = False, None
    if experiment_id is None and experiment_name is None:
        if not in_trial:
            raise ValueError("setup_mlflow outside a trial needs experiment_id or "
                             "experiment_name")
        experiment_name, create = context.get_experiment_name(), True

    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    _check_reachable(mlflow.get_tracking_uri())
    if registry_uri:
        mlflow.set_registry_uri(registry_uri)
    client = MlflowClient()
    exp_id = _experiment_id(client, experiment_id, experiment_name,
                            artifact_location or settings.get("artifact_location"), create)
    active = mlflow.active_run()
    if active is None:  # Ray: an active run in this thread is reused
        active = mlflow.start_run(experiment_id=exp_id, tags=tags,
                                  run_name=run_name or trial_name or experiment_name)
        if in_trial:
            at_attempt_end(lambda failed: mlflow.end_run("FAILED" if failed else "FINISHED"))
    params = _params(config)
    items = list(params.items())
    for i in range(0, len(items), _PARAM_BATCH):
        mlflow.log_params(dict(items[i:i + _PARAM_BATCH]))
    return mlflow


class MLflowLoggerCallback(BackgroundLogger):
    """Log each trial as an MLflow run: its config as parameters, every result's numeric
    values as metrics (step: ``timesteps_total`` if reported, else
    ``training_iteration``), its folder as artifacts at its end (``save_artifact``).

    Args:
        tracking_uri: where MLflow tracks (a server URL, ``sqlite:///...``); MLflow's
            default (``MLFLOW_TRACKING_URI``) when None.
        registry_uri: MLflow's model registry URI.
        experiment_name: the MLflow experiment, created if missing; default
            ``MLFLOW_EXPERIMENT_NAME``, else the Tune experiment's name.
        tags: tags set on every run (plus ``trial_name``).
        tracking_token: sets ``MLFLOW_TRACKING_TOKEN``.
        save_artifact: upload the trial's folder (results, checkpoints) at its end.
        log_params_on_trial_end: log the config at the trial's end, not its start.
    """

    service = "mlflow"

    def __init__(self, tracking_uri: str | None = None, *, registry_uri: str | None = None,
                 experiment_name: str | None = None, tags: dict[str, Any] | None = None,
                 tracking_token: str | None = None, save_artifact: bool = False,
                 log_params_on_trial_end: bool = False):
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.should_save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end
        self.client: MlflowClient | None = None
        self.experiment_id: str | None = None
        self._runs: dict[str, str] = {}  # trial_id -> run_id (read on the logger thread)
        self._pending: dict[str, list[Metric]] = {}  # trial_id -> metrics not sent yet
        self._started: set[str] = set()  # trials whose run this logger started

    def setup(self, *args: Any, **info: Any) -> None:
        super().setup(*args, **info)
        # Here, not on the logger thread: a wrong URI or server fails before any trial.
        if self.tracking_token:
            os.environ["MLFLOW_TRACKING_TOKEN"] = self.tracking_token
        _check_reachable(self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)
        name = self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or \
            (self.storage.name if self.storage is not None else "dasktune")
        self.experiment_id = _experiment_id(self.client, None, name, None, create=True)

    # ------------------------------------------------------- driver side (quick)
    def log_trial_start(self, trial: Trial) -> None:
        self._started.add(trial.trial_id)
        config = None if self.log_params_on_trial_end else dict(trial.config)
        self.submit(self._start_run, trial.trial_id, str(trial), config)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        if trial.trial_id not in self._started:  # a result a restore logs, before any start
            self.log_trial_start(trial)
        step = result.get("timesteps_total") or result.get("training_iteration") or iteration
        now = int(time.time() * 1000)
        self._pending.setdefault(trial.trial_id, []).extend(
            Metric(key, value, now, int(step)) for key, value in _metrics(result).items())

    def flush(self) -> None:
        for trial_id in list(self._pending):
            self._send(trial_id)

    def _send(self, trial_id: str) -> None:
        metrics = self._pending.pop(trial_id, None)
        if metrics:
            self.submit(self._log_metrics, trial_id, metrics)

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        self._send(trial.trial_id)
        config = dict(trial.config) if self.log_params_on_trial_end else None
        self.submit(self._end_run, trial.trial_id, trial.path, config,
                    "FAILED" if failed else "FINISHED")

    # ------------------------------------------------------ the logger's thread
    def _start_run(self, trial_id: str, name: str, config: dict[str, Any] | None) -> None:
        assert self.client is not None and self.experiment_id is not None
        if trial_id not in self._runs:  # a restarted trial goes on in its run
            run = self.client.create_run(self.experiment_id, run_name=name,
                                         tags={**self.tags, "trial_name": name})
            self._runs[trial_id] = run.info.run_id
        elif self.client.get_run(self._runs[trial_id]).info.status != "RUNNING":
            self.client.update_run(self._runs[trial_id], status="RUNNING")
        if config is not None:
            self._log_params(trial_id, config)

    def _log_params(self, trial_id: str, config: dict[str, Any]) -> None:
        assert self.client is not None
        params = [Param(k, v) for k, v in _params(config).items()]
        for i in range(0, len(params), _PARAM_BATCH):
            self.client.log_batch(self._runs[trial_id], params=params[i:i + _PARAM_BATCH])

    def _log_metrics(self, trial_id: str, metrics: list[Metric]) -> None:
        assert self.client is not None
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(self._runs[trial_id], metrics=metrics[i:i + _BATCH])

    def _end_run(self, trial_id: str, trial_path: str | None, config: dict[str, Any] | None,
                 status: str) -> None:
        assert self.client is not None
        run_id = self._runs.get(trial_id)
        if run_id is None:
            return
        if config is not None:
            self._log_params(trial_id, config)
        if self.should_save_artifact and trial_path and self.storage is not None:
            self._save_artifacts(run_id, trial_path)
        self.client.set_terminated(run_id, status=status)

    def _save_artifacts(self, run_id: str, trial_path: str) -> None:
        assert self.client is not None and self.storage is not None
        # The file loggers close the trial's files on the storage's io thread: wait for
        # them, so that the upload has every line.
        self.storage.drain()
        if self.storage.is_local:
            self.client.log_artifacts(run_id, trial_path)
            return
        folder = tempfile.mkdtemp(prefix="dasktune-mlflow-")
        try:
            self.storage.download(trial_path, folder)
            self.client.log_artifacts(run_id, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


__all__ = ["MLflowLoggerCallback", "setup_mlflow"]
