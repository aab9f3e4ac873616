"""PB2's model: a time-varying Gaussian process and the GP-UCB pick of new hyperparameters.

Population Based Bandits (Parker-Holder et al., 2020) model how fast a trial's score improves
over the next perturbation interval from ``(time, score before, hyperparameters)`` with a
time-varying GP (TV-GP-UCB, Bogunovic et al., 2016): points further apart in time are less
alike, so old observations fade as training moves on. The next hyperparameters maximise the
upper confidence bound given the clone's time and score. Built on scikit-learn's public
Gaussian process API (a :class:`~sklearn.gaussian_process.kernels.Kernel` subclass) and
scipy's L-BFGS-B; imported only when :class:`~dasktune.schedulers.pb2.PB2` is built.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy.optimize import minimize
from scipy.spatial.distance import cdist
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Hyperparameter, Kernel, WhiteKernel

__all__ = ["TimeVaryingRBF", "propose"]

# Observations kept for a fit: the GP costs O(n^3), and old ones have faded anyway.
MAX_POINTS = 250
_SWEEP = 512  # random points the acquisition is first evaluated at
_STARTS = 3  # the best of them, where its optimiser starts


class TimeVaryingRBF(Kernel):
    """``(1 - epsilon) ** (|t - t'| / 2) * exp(-|z - z'|^2 / (2 length_scale^2))``.

    Column 0 of each point is time ``t``; the other columns ``z`` are the features. The
    first factor forgets at rate ``epsilon`` per unit of time; the second is an RBF kernel.
    Both are fitted (log scale) by the regressor, like any scikit-learn kernel.
    """

    def __init__(self, length_scale: float = 1.0, epsilon: float = 0.1,
                 length_scale_bounds: tuple[float, float] = (1e-3, 1e3),
                 epsilon_bounds: tuple[float, float] = (1e-5, 0.5)):
        self.length_scale = length_scale
        self.epsilon = epsilon
        self.length_scale_bounds = length_scale_bounds
        self.epsilon_bounds = epsilon_bounds

    @property
    def hyperparameter_length_scale(self) -> Hyperparameter:
        return Hyperparameter("length_scale", "numeric", self.length_scale_bounds)

    @property
    def hyperparameter_epsilon(self) -> Hyperparameter:
        return Hyperparameter("epsilon", "numeric", self.epsilon_bounds)

    def __call__(self, X, Y=None, eval_gradient=False):  # noqa: N803 - sklearn's names
        X = np.atleast_2d(X)
        if Y is not None and eval_gradient:
            raise ValueError("gradient can only be evaluated when Y is None")
        Y = X if Y is None else np.atleast_2d(Y)
        dt = np.abs(X[:, :1] - Y[:, :1].T)
        d2 = cdist(X[:, 1:], Y[:, 1:], "sqeuclidean")
        ls, eps = float(self.length_scale), float(self.epsilon)
        K = (1.0 - eps) ** (dt / 2.0) * np.exp(-d2 / (2.0 * ls * ls))
        if not eval_gradient:
            return K
        # Gradients with respect to log(parameter), in self.hyperparameters' order.
        grads = {"length_scale": K * d2 / (ls * ls),
                 "epsilon": -K * (dt / 2.0) * eps / (1.0 - eps)}
        parts = [grads[h.name] for h in self.hyperparameters if not h.fixed]
        return K, (np.dstack(parts) if parts else np.empty((X.shape[0], X.shape[0], 0)))

    def diag(self, X):  # noqa: N803 - sklearn's names
        return np.ones(np.atleast_2d(X).shape[0])

    def is_stationary(self) -> bool:
        return False  # the time factor is, but the pair is treated as a whole


def _scale(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    span = np.where(hi > lo, hi - lo, 1.0)
    return (values - lo) / span


def _fit(X: np.ndarray, y: np.ndarray, seed: int) -> GaussianProcessRegressor:
    kernel = ConstantKernel(1.0, (1e-3, 1e3)) * TimeVaryingRBF() + \
        WhiteKernel(1e-2, (1e-6, 1.0))
    for alpha in (1e-8, 1e-4, 1e-2):  # more jitter if the kernel matrix is not PD
        gp = GaussianProcessRegressor(kernel=kernel, alpha=alpha, n_restarts_optimizer=1,
                                      random_state=seed)
        try:
            with warnings.catch_warnings():  # a parameter at its bound is fine here
                warnings.simplefilter("ignore", ConvergenceWarning)
                return gp.fit(X, y)
        except np.linalg.LinAlgError:
            continue
    raise np.linalg.LinAlgError("PB2: the GP could not be fitted even with added jitter")


def propose(X: np.ndarray, y: np.ndarray, start: Sequence[float],
            pending: np.ndarray | None, seed: int) -> np.ndarray:
    """The hyperparameters, scaled to ``[0, 1]``, that maximise GP-UCB.

    Args:
        X: one row per observed interval, ``[time, score before, h_1 .. h_d]`` with the
            hyperparameters already scaled to ``[0, 1]`` by their bounds.
        y: the score's change per unit of time over each interval.
        start: ``(time, score)`` the clone starts from (fixed, not optimised).
        pending: ``(m, d)`` scaled hyperparameters already chosen in this round, or None.
            The GP's variance does not depend on the labels, so conditioning on them with
            any label lowers the bonus near them: a round does not pick one point twice
            (the batch trick of GP-BUCB, Desautels et al., 2014).
        seed: seeds the regressor's restarts and the optimiser's starts.
    """
    X = np.asarray(X, dtype=float)[-MAX_POINTS:]
    y = np.asarray(y, dtype=float)[-MAX_POINTS:]
    d = X.shape[1] - 2
    lo, hi = X[:, :2].min(axis=0), X[:, :2].max(axis=0)
    Xs = np.hstack([_scale(X[:, :2], lo, hi), X[:, 2:]])
    fixed = _scale(np.asarray(start, dtype=float), lo, hi)
    # Standardise, and clip outliers so one jump in score does not dominate the fit.
    ys = np.clip((y - y.mean()) / (y.std() + 1e-8), -2.0, 2.0)
    mean_gp = _fit(Xs, ys, seed)
    var_gp = mean_gp
    if pending is not None and len(pending):
        extra = np.hstack([np.tile(fixed, (len(pending), 1)), np.asarray(pending, float)])
        var_gp = GaussianProcessRegressor(kernel=mean_gp.kernel_, optimizer=None,
                                          alpha=mean_gp.alpha).fit(
            np.vstack([Xs, extra]), np.concatenate([ys, np.zeros(len(pending))]))
    # GP-UCB's exploration weight grows slowly with the data (the PB2 paper's schedule).
    kappa = math.sqrt(0.2 + max(0.0, math.log(0.4 * len(Xs))))

    def ucb(h: np.ndarray) -> np.ndarray:
        points = np.hstack([np.tile(fixed, (len(h), 1)), h])
        _, std = var_gp.predict(points, return_std=True)
        return mean_gp.predict(points) + kappa * std

    # A random sweep, then L-BFGS-B from the best few points of it.
    rng = np.random.default_rng(seed)
    sweep = rng.uniform(0.0, 1.0, (_SWEEP, d))
    values = ucb(sweep)
    best = sweep[int(np.argmax(values))]
    best_value = float(values.max())
    for x0 in sweep[np.argsort(values)[-_STARTS:]]:
        res = minimize(lambda h: -ucb(h[None, :])[0], x0, method="L-BFGS-B",
                       bounds=[(0.0, 1.0)] * d, options={"maxiter": 50})
        if -res.fun > best_value:
            best, best_value = res.x, -float(res.fun)
    return np.clip(best, 0.0, 1.0)
