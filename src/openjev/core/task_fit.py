"""Per-task calibration: a temperature and a per-option bias fitted on one task's own
labelled examples, shrunk toward the model's global fit, chosen by cross-validation.

Model: p_i proportional to exp(a * l_i + b_i), l_i the option's log-probability after the
global fit's position prior, a = 1/T. The negative log-likelihood is convex in (a, b), so
a damped Newton solve finds the optimum of

    sum over examples of NLL  +  lambda * ((a - a_g)^2 + sum_i (b_i - b_g,i)^2)

where (a_g, b_g) is the global fit (core/calibration.py; the identity where the model has
none). lambda counts like examples: with 10 examples, lambda = 32 keeps the fit near the
global one, with 1000 it hardly matters. The form (temperature alone, or with the bias)
and lambda are chosen by k-fold cross-validated NLL on the task's examples, the global fit
unchanged among the candidates; a candidate replaces it only where its cross-validated loss
is lower by more than one standard error of the paired difference, so a task whose few
examples do not clearly support a change keeps the global fit.
The figures after are nested cross-validated: each example predicted by the whole
procedure (choice of form and shrinkage included) run without its fold, so the choice does
not flatter them; those before are the global fit's, which saw none of the examples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from openjev.core.calibration import TypeFit
from openjev.core.task_figures import Figures, Threshold, figures, threshold

MIN_EXAMPLES = 10
FOLDS = 5
SHRINKAGE = (2.0, 8.0, 32.0, 128.0)
FORMS = ("temperature", "temperature+bias")
_SCALE = (0.02, 20.0)  # a = 1/T, T in [0.05, 50] as the global fits (evals/fit.py)
_BIAS = 5.0
_RIDGE = 1e-6  # strict convexity where the examples separate perfectly
_FLOOR = 1e-12


@dataclass(frozen=True)
class Example:
    """One labelled reading: `logs` per option in the task's order (any constant added to
    all of them changes nothing), `gold` the index of the gold option."""

    logs: tuple[float, ...]
    gold: int


@dataclass(frozen=True)
class Params:
    """a = 1/T and one bias per option (the first 0: only differences matter)."""

    scale: float
    bias: tuple[float, ...]

    def probs(self, logs: Sequence[float]) -> list[float]:
        z = [self.scale * v + self.bias[i] for i, v in enumerate(logs)]
        top = max(z)
        w = [math.exp(v - top) for v in z]
        total = math.fsum(w)
        return [v / total for v in w]


@dataclass(frozen=True)
class TaskFit:
    """The chosen fit (`form`: global, temperature or temperature+bias; `shrinkage`: its
    lambda, None for the global fit unchanged), the cross-validated figures before and after,
    the abstain threshold for the target precision on the after predictions, and each
    candidate's cross-validated NLL per example."""

    params: Params
    form: str
    shrinkage: float | None
    before: Figures
    after: Figures
    threshold: Threshold
    cv_nll: dict[str, float]

    def type_fit(self, base: TypeFit | None) -> TypeFit:
        """The fit as core/calibration.py applies it (the global fit's position prior kept)."""
        prior = base.position_prior if base is not None else {}
        return TypeFit(1.0 / self.params.scale, self.params.bias, dict(prior))


def global_params(base: TypeFit | None, n: int) -> Params:
    """The global fit in this model's terms (identity where there is none)."""
    if base is None:
        return Params(1.0, (0.0,) * n)
    bias = [base.bias[i] if i < len(base.bias) else 0.0 for i in range(n)]
    return Params(1.0 / base.temperature, tuple(b - bias[0] for b in bias))


def nll(params: Params, examples: Sequence[Example]) -> float:
    return math.fsum(-math.log(max(params.probs(e.logs)[e.gold], _FLOOR)) for e in examples)


def solve(examples: Sequence[Example], prior: Params, shrinkage: float, with_bias: bool) -> Params:
    """The penalised optimum (module doc); bias held at the prior's without `with_bias`."""
    n = len(prior.bias)
    theta = _clamped([prior.scale, *prior.bias[1:]] if with_bias else [prior.scale])
    target = list(theta)

    def unpack(t: Sequence[float]) -> Params:
        return Params(t[0], (0.0, *t[1:]) if with_bias else prior.bias)

    def objective(t: Sequence[float]) -> float:
        return nll(unpack(t), examples) + shrinkage * math.fsum((x - y) ** 2 for x, y in zip(t, target, strict=True))

    value = objective(theta)
    for _ in range(50):
        grad, hess = _derivatives(unpack(theta), examples, with_bias, n)
        for i in range(len(theta)):
            grad[i] += 2 * shrinkage * (theta[i] - target[i])
            hess[i][i] += 2 * shrinkage + _RIDGE
        step = _linear_solve(hess, grad)
        scale = 1.0
        while scale > 1e-6:
            trial = _clamped([x - scale * s for x, s in zip(theta, step, strict=True)])
            new = objective(trial)
            if new <= value:
                break
            scale /= 2
        else:
            break
        converged = value - new < 1e-10
        theta, value = trial, new
        if converged:
            break
    return unpack(theta)


def _clamped(theta: Sequence[float]) -> list[float]:
    """(a, b...) within their bounds."""
    return [min(max(theta[0], _SCALE[0]), _SCALE[1]), *(min(max(b, -_BIAS), _BIAS) for b in theta[1:])]


def _derivatives(
    params: Params, examples: Sequence[Example], with_bias: bool, n: int
) -> tuple[list[float], list[list[float]]]:
    """Gradient and Hessian of the summed NLL in (a, b_1..b_{n-1}) (or in a alone)."""
    d = n if with_bias else 1
    grad = [0.0] * d
    hess = [[0.0] * d for _ in range(d)]
    for e in examples:
        p = params.probs(e.logs)
        mean_l = math.fsum(pi * li for pi, li in zip(p, e.logs, strict=True))
        # dz/da = l, dz/db_j = e_j: the softmax's Hessian diag(p) - pp^T in those directions
        grad[0] += mean_l - e.logs[e.gold]
        hess[0][0] += math.fsum(pi * (li - mean_l) ** 2 for pi, li in zip(p, e.logs, strict=True))
        if not with_bias:
            continue
        for j in range(1, n):
            grad[j] += p[j] - (j == e.gold)
            cross = p[j] * (e.logs[j] - mean_l)
            hess[0][j] += cross
            hess[j][0] += cross
            for k in range(1, n):
                hess[j][k] += (p[j] if j == k else 0.0) - p[j] * p[k]
    return grad, hess


def _linear_solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """x with matrix x = rhs (Gaussian elimination with partial pivoting; a few unknowns)."""
    m = [[*row, r] for row, r in zip(matrix, rhs, strict=True)]
    size = len(m)
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-15:
            return [0.0] * size
        for r in range(col + 1, size):
            f = m[r][col] / m[col][col]
            for c in range(col, size + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * size
    for r in range(size - 1, -1, -1):
        x[r] = (m[r][size] - math.fsum(m[r][c] * x[c] for c in range(r + 1, size))) / m[r][r]
    return x


def folds_of(count: int, folds: int, seed: int) -> list[int]:
    """Each example's fold, shuffled once by `seed` and dealt round-robin (sizes differ by 1 at most)."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    fold = [0] * count
    for k, i in enumerate(order):
        fold[i] = k % folds
    return fold


def cross_validated(
    examples: Sequence[Example], prior: Params, shrinkage: float, with_bias: bool, fold: Sequence[int], folds: int
) -> list[list[float]]:
    """Each example's probabilities from the fit on the other folds."""
    out: list[list[float]] = [[] for _ in examples]
    for k in range(folds):
        train = [e for e, f in zip(examples, fold, strict=True) if f != k]
        params = solve(train, prior, shrinkage, with_bias)
        for i, f in enumerate(fold):
            if f == k:
                out[i] = params.probs(examples[i].logs)
    return out


def _clearly_better(loss: Sequence[float], global_loss: Sequence[float]) -> bool:
    """Whether a candidate's cross-validated loss beats the global fit's by more than one
    standard error of their paired difference: a few examples' noise does not move the fit."""
    diffs = [g - c for c, g in zip(loss, global_loss, strict=True)]
    mean = math.fsum(diffs) / len(diffs)
    spread = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1))
    return mean > spread / math.sqrt(len(diffs))


def select(
    examples: Sequence[Example], prior: Params, folds: int, seed: int
) -> tuple[str, float | None, dict[str, float]]:
    """The form and shrinkage chosen by `folds`-fold cross-validated NLL (module doc), and
    each candidate's mean cross-validated NLL."""
    n = len(prior.bias)
    fold = folds_of(len(examples), folds, seed)
    candidates: dict[str, tuple[str, float | None, list[list[float]]]] = {
        "global": ("global", None, [prior.probs(e.logs) for e in examples])
    }
    for form in FORMS if n > 1 else FORMS[:1]:
        for shrinkage in SHRINKAGE:
            cv = cross_validated(examples, prior, shrinkage, form != "temperature", fold, folds)
            candidates[f"{form};shrinkage={shrinkage:g}"] = (form, shrinkage, cv)
    losses = {
        name: [-math.log(max(p[e.gold], _FLOOR)) for p, e in zip(cv, examples, strict=True)]
        for name, (_, _, cv) in candidates.items()
    }
    scores = {name: math.fsum(loss) / len(loss) for name, loss in losses.items()}
    chosen = min(
        (name for name in losses if name == "global" or _clearly_better(losses[name], losses["global"])),
        key=lambda name: scores[name],
    )
    return candidates[chosen][0], candidates[chosen][1], scores


def fitted(examples: Sequence[Example], prior: Params, folds: int, seed: int) -> tuple[Params, str, float | None]:
    """The whole procedure on `examples`: the chosen candidate, refitted on all of them."""
    form, shrinkage, _ = select(examples, prior, folds, seed)
    params = prior if shrinkage is None else solve(examples, prior, shrinkage, form != "temperature")
    return params, form, shrinkage


def honest_predictions(examples: Sequence[Example], prior: Params, folds: int, seed: int) -> list[list[float]]:
    """Each example's probabilities from the whole procedure (the choice of form and
    shrinkage included) run on the other folds: nested cross-validation, so the figures a
    task reports are not flattered by the choice made on the same folds."""
    outer = folds_of(len(examples), folds, seed + 1)
    out: list[list[float]] = [[] for _ in examples]
    for k in range(folds):
        train = [e for e, f in zip(examples, outer, strict=True) if f != k]
        params, _, _ = fitted(train, prior, min(folds, len(train)), seed)
        for i, f in enumerate(outer):
            if f == k:
                out[i] = params.probs(examples[i].logs)
    return out


def fit_task(
    examples: Sequence[Example],
    base: TypeFit | None,
    target_precision: float,
    *,
    folds: int = FOLDS,
    seed: int = 0,
) -> TaskFit:
    """The task's fit (module doc). ValueError for fewer than MIN_EXAMPLES examples, or
    examples of differing option counts."""
    if len(examples) < MIN_EXAMPLES:
        raise ValueError(f"a task needs at least {MIN_EXAMPLES} labelled examples to fit, it has {len(examples)}")
    n = len(examples[0].logs)
    if any(len(e.logs) != n or not 0 <= e.gold < n for e in examples):
        raise ValueError("every example must read the task's options, its gold one of them")
    prior = global_params(base, n)
    form, shrinkage, scores = select(examples, prior, folds, seed)
    params = prior if shrinkage is None else solve(examples, prior, shrinkage, form != "temperature")
    after_rows = [(p, e.gold) for p, e in zip(honest_predictions(examples, prior, folds, seed), examples, strict=True)]
    return TaskFit(
        params=params,
        form=form,
        shrinkage=shrinkage,
        before=figures([(prior.probs(e.logs), e.gold) for e in examples]),
        after=figures(after_rows),
        threshold=threshold(after_rows, target_precision),
        cv_nll={name: round(v, 6) for name, v in scores.items()},
    )
