"""Fitting a calibration (numpy + scipy): per question type, a temperature and, where it
lowers held-out error, a per-position prior correction (see core/calibration.py).

The loss is the mean negative log-likelihood of the correct option after calibration,
with a small ridge on the prior correction. Whether the correction is kept is decided by
k-fold cross-validation on the data given (the dev split): it must lower the held-out NLL
of the temperature-only fit by more than `min_gain`. Then the chosen form is refit on all
of it. Nothing here sees the test split.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import minimize
from scipy.special import logsumexp

from openjev.evals.metrics import Scored

FLOOR = 1e-12  # the same floor core.calibration.apply uses
MAX_BIAS_POSITIONS = 10
RIDGE = 0.01
MIN_GAIN = 1e-3


def _arrays(samples: Sequence[Scored]) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(s.probs) for s in samples)
    logp = np.full((len(samples), width), -np.inf)
    for i, s in enumerate(samples):
        logp[i, : len(s.probs)] = np.log(np.maximum(np.asarray(s.probs, dtype=float), FLOOR))
    return logp, np.array([s.correct for s in samples])


def _bias(theta: np.ndarray, width: int) -> np.ndarray:
    b = np.zeros(width)
    b[1 : 1 + len(theta) - 1] = theta[1:]
    return b


def _nll(theta: np.ndarray, logp: np.ndarray, correct: np.ndarray, ridge: float) -> float:
    t = np.exp(theta[0])
    z = logp / t + _bias(theta, logp.shape[1])
    z = np.where(np.isfinite(logp), z, -np.inf)
    lse = logsumexp(z, axis=1)
    nll = float(np.mean(lse - z[np.arange(len(correct)), correct]))
    return nll + ridge * float(np.sum(theta[1:] ** 2))


def _fit(logp: np.ndarray, correct: np.ndarray, n_bias: int) -> np.ndarray:
    theta0 = np.zeros(1 + n_bias)
    bounds = [(np.log(0.05), np.log(50.0))] + [(-5.0, 5.0)] * n_bias
    res = minimize(_nll, theta0, args=(logp, correct, RIDGE if n_bias else 0.0), method="L-BFGS-B", bounds=bounds)
    return res.x


def _cv_nll(logp: np.ndarray, correct: np.ndarray, n_bias: int, folds: int, seed: int) -> float:
    order = np.random.default_rng(seed).permutation(len(correct))
    total = 0.0
    for k in range(folds):
        held = order[k::folds]
        train = np.setdiff1d(order, held)
        theta = _fit(logp[train], correct[train], n_bias)
        total += _nll(theta, logp[held], correct[held], 0.0) * len(held)
    return total / len(correct)


def fit_type(samples: Sequence[Scored], *, folds: int = 5, seed: int = 0, prior: bool = True) -> dict:
    """The fit for one question type, with the evidence for its form:
    {"temperature", "bias", "n", "nll_before", "nll_after", "cv_nll": {...}, "form"}.
    `prior=False`: temperature only (a per-position correction would make an order-free
    readout depend on the caller's order again)."""
    logp, correct = _arrays(samples)
    n_bias = min(logp.shape[1], MAX_BIAS_POSITIONS) - 1 if prior else 0
    identity = np.zeros(1)
    cv = {"none": _nll(identity, logp, correct, 0.0)}
    can_cv = len(samples) >= 2 * folds
    if can_cv:
        cv["temperature"] = _cv_nll(logp, correct, 0, folds, seed)
        cv["temperature+prior"] = _cv_nll(logp, correct, n_bias, folds, seed) if n_bias else float("inf")
    use_bias = prior and can_cv and n_bias > 0 and cv["temperature+prior"] < cv["temperature"] - MIN_GAIN
    theta = _fit(logp, correct, n_bias if use_bias else 0)
    return {
        "temperature": float(np.exp(theta[0])),
        "bias": [float(x) for x in _bias(theta, n_bias + 1)] if use_bias else [],
        "n": len(samples),
        "nll_before": cv["none"],
        "nll_after": _nll(theta, logp, correct, 0.0),
        "cv_nll": {k: round(v, 5) for k, v in cv.items()},
        "form": "temperature+prior" if use_bias else "temperature",
    }


def fit_readout(scored: Sequence[Scored], *, order_free: Sequence[str] = (), prior: bool = True) -> dict[str, dict]:
    """Fits per question type present (types with fewer than 10 questions are left out).
    `order_free`: question types the readout reads independently of the caller's option
    order; they get no per-position correction. `prior=False`: a temperature per type only
    (one parameter: what a small dev set can support without overfitting; the
    cross-validated NLL of the prior form is still reported)."""
    out = {}
    for qtype in ("noul", "choice", "score"):
        samples = [s for s in scored if s.qtype == qtype]
        if len(samples) >= 10:
            out[qtype] = fit_type(samples, prior=prior and qtype not in order_free)
    return out


def fit_type_worst_group(samples: Sequence[Scored], groups: Sequence[str], *, grid: int = 241) -> dict:
    """A temperature for text the fit has not seen: the T whose worst group (by the mean NLL
    of that group's questions) is best, over a log grid of T in [0.05, 50]. Groups are kinds
    of text (openjev.evals.domains). Where every group is best served by flattening, this
    gives the flat answer rather than the pooled optimum that some group pays for. The
    same fields as fit_type (no prior: a per-position or per-level correction is what fails
    to carry across text)."""
    return _worst_group_fit(samples, groups, grid, against_guess=False)


def fit_type_worst_excess(samples: Sequence[Scored], groups: Sequence[str], *, grid: int = 241) -> dict:
    """fit_type_worst_group judged against a guess: the T whose worst group is least above
    that group's uniform answer (its mean NLL minus the mean log of its option counts), over
    the same T grid. A group's NLL alone ranks groups by how many options their questions
    have (a 5-level scale costs log 5 to a guess, a 3-level one log 3), so the plain worst
    group is the one with the longest scales, not the one the model reads worst; by excess,
    the group the fit must not fail is the one where the model's answer is furthest behind
    a guess. Same fields as fit_type_worst_group, `worst_group_excess` for its worst."""
    return _worst_group_fit(samples, groups, grid, against_guess=True)


def _worst_group_fit(samples: Sequence[Scored], groups: Sequence[str], grid: int, *, against_guess: bool) -> dict:
    logp, correct = _arrays(samples)
    guess = np.log(np.isfinite(logp).sum(axis=1))
    names = sorted(set(groups))
    member = [m for m in (np.array([g == name for g in groups]) for name in names) if m.any()]
    # what each group is judged against: nothing, or its own uniform answer
    base = [float(guess[m].mean()) if against_guess else 0.0 for m in member]
    best_theta, best_worst = 0.0, float("inf")
    for theta in np.linspace(np.log(0.05), np.log(50.0), grid):
        t = np.array([theta])
        worst = max(_nll(t, logp[m], correct[m], 0.0) - b for m, b in zip(member, base, strict=True))
        if worst < best_worst - 1e-12:
            best_theta, best_worst = float(theta), worst
    theta_arr = np.array([best_theta])
    return {
        "temperature": float(np.exp(best_theta)),
        "bias": [],
        "n": len(samples),
        "groups": len(names),
        "nll_before": _nll(np.zeros(1), logp, correct, 0.0),
        "nll_after": _nll(theta_arr, logp, correct, 0.0),
        "worst_group_excess" if against_guess else "worst_group_nll": best_worst,
        "form": "temperature (worst group over a guess)" if against_guess else "temperature (worst group)",
    }


# λ, the weight of the uniform answer in the mix: 0 (none) .. 0.9. Never 1: the answer
# would then be the uniform one whatever the model read, its pick a tie broken by position;
# at 0.9 the model's ranking survives (its pick, ordered probabilities) at a bounded cost.
UNIFORM_WEIGHTS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def _group_nlls(logp: np.ndarray, correct: np.ndarray, theta: float, member: list[np.ndarray]) -> np.ndarray:
    """Per group (rows) and per λ of UNIFORM_WEIGHTS (columns): the mean NLL of the correct
    option under (1 - λ) softmax(log p / T) + λ / n."""
    z = np.where(np.isfinite(logp), logp / np.exp(theta), -np.inf)
    p = np.exp(z - logsumexp(z, axis=1, keepdims=True))[np.arange(len(correct)), correct]
    n = np.isfinite(logp).sum(axis=1)
    lam = np.asarray(UNIFORM_WEIGHTS)
    mixed = -np.log(np.maximum((1 - lam)[None, :] * p[:, None] + lam[None, :] / n[:, None], FLOOR))
    return np.stack([mixed[m].mean(axis=0) for m in member])


def fit_type_worst_group_uniform(samples: Sequence[Scored], groups: Sequence[str], *, grid: int = 121) -> dict:
    """fit_type_worst_group with the uniform mix: the (T, λ) whose worst group is best, over
    the T grid and UNIFORM_WEIGHTS. λ bounds the cost of a confident mistake, so a kind of
    text that a model reads wrong with confidence need not flatten every other kind's answers
    through T; where the model carries no information on any kind, the best is next to the
    uniform answer (λ = 0.9)."""
    logp, correct = _arrays(samples)
    names = sorted(set(groups))
    member = [m for m in (np.array([g == name for g in groups]) for name in names) if m.any()]
    best = (0.0, 0.0, float("inf"))
    for theta in np.linspace(np.log(0.05), np.log(50.0), grid):
        worst = _group_nlls(logp, correct, float(theta), member).max(axis=0)
        j = int(np.argmin(worst))
        # ties (the uniform answer ties at every T): the smallest λ, then the smallest T
        if worst[j] < best[2] - 1e-12:
            best = (float(theta), UNIFORM_WEIGHTS[j], float(worst[j]))
    theta, lam, worst_nll = best
    return {
        "temperature": float(np.exp(theta)),
        "bias": [],
        "uniform_weight": lam,
        "n": len(samples),
        "groups": len(names),
        "nll_before": _nll(np.zeros(1), logp, correct, 0.0),
        "nll_after": float(
            _group_nlls(logp, correct, theta, [np.ones(len(correct), bool)])[0][UNIFORM_WEIGHTS.index(lam)]
        ),
        "worst_group_nll": worst_nll,
        "form": "temperature and uniform mix (worst group)",
    }


def fit_type_held_out_uniform(samples: Sequence[Scored], groups: Sequence[str], *, grid: int = 121) -> dict:
    """T and the uniform mix λ chosen for text the fit has not seen, by leave-one-group-out
    on the training data itself: for each λ of UNIFORM_WEIGHTS and each group g, T is fitted
    (pooled NLL, on the T grid) on the other groups and judged on g; the λ whose worst
    held-out group is best is kept, and T is then refitted on all groups at that λ. Unlike
    fit_type_worst_group_uniform, the λ is judged on groups its T never saw, as the text a
    server meets will be."""
    logp, correct = _arrays(samples)
    names = sorted(set(groups))
    member = [m for m in (np.array([g == name for g in groups]) for name in names) if m.any()]
    sizes = np.array([m.sum() for m in member], dtype=float)
    thetas = np.linspace(np.log(0.05), np.log(50.0), grid)
    means = np.stack([_group_nlls(logp, correct, float(t), member) for t in thetas])  # [T, group, λ]
    totals = means * sizes[None, :, None]
    held = np.empty((len(member), len(UNIFORM_WEIGHTS)))
    for g in range(len(member)):
        rest = (totals.sum(axis=1) - totals[:, g, :]) / (sizes.sum() - sizes[g])  # [T, λ]
        held[g] = means[rest.argmin(axis=0), g, np.arange(len(UNIFORM_WEIGHTS))]
    worst = held.max(axis=0)
    j = int(np.argmin(worst))  # ties: the smallest λ
    pooled = totals.sum(axis=1) / sizes.sum()
    t = int(pooled[:, j].argmin())
    return {
        "temperature": float(np.exp(thetas[t])),
        "bias": [],
        "uniform_weight": UNIFORM_WEIGHTS[j],
        "n": len(samples),
        "groups": len(names),
        "nll_before": _nll(np.zeros(1), logp, correct, 0.0),
        "nll_after": float(pooled[t, j]),
        "worst_held_out_group_nll": float(worst[j]),
        "form": "temperature and uniform mix (leave-one-group-out)",
    }
