"""Calibration of the flow model on the baseline, and its error measured three ways.

The modelled time of an instance has two terms: a latency (NCCL's fixed cost, or the path latency
of its flows where NCCL's model has none) and a transfer (the simulated time without the path
latency, which scales with bytes over bandwidth). Per (op, algorithm) the trace is fitted as
`traced ~= a * latency + b * transfer` (`TwoTerms`: a, b >= 0, least absolute relative error, so
outliers weigh as a median does), and a what-if that changes only bandwidth moves only the `b`
term. A group with too few instances or sizes to tell the terms apart (fewer than MIN_INSTANCES,
or MIN_BUCKETS size buckets, or latency shares spread by less than MIN_SHARE_SPREAD) falls back
to one factor per (op, size bucket): the efficiency, the median of traced / modelled duration
over its instances.

The error is reported as `uncalibrated` (the raw model against the trace), `in_sample` (fitted
and scored on the same instances: optimistic by construction) and `cross_validated` (each
instance scored with factors fitted without it: leave one step out when the run has several
steps, else leave one instance out). A bucket with nothing to fit from
takes the efficiency interpolated between the nearest fitted sizes of the same op (or the nearest
one), or none at all (1, the raw model) when the op has no fitted bucket; such buckets are flagged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from tracekit.results import Result

FITTED, INTERPOLATED, UNCALIBRATED, NO_FLOWS = "fitted", "interpolated", "uncalibrated", "no_flows"
#: Two terms are fitted only on at least this many instances (two would fix both factors exactly,
#: with nothing left to tell a stalled call from a trend) ...
MIN_INSTANCES = 3
#: ... spanning this many size buckets ...
MIN_BUCKETS = 2
#: ... whose latency shares (latency / modelled time) spread over at least this much.
MIN_SHARE_SPREAD = 0.2
IRLS_ROUNDS = 60
#: Without steps to leave out, a two-term group of more instances than this is cross-validated in
#: LARGE_GROUP_FOLDS folds (every tenth instance held out together) instead of one instance at a time.
LOO_MAX = 200
LARGE_GROUP_FOLDS = 10
LEAVE_ONE_STEP_OUT, LEAVE_ONE_INSTANCE_OUT = "leave-one-step-out", "leave-one-instance-out"
KINDS = ("uncalibrated", "in_sample", "cross_validated")
WHAT_IF_NOTE = ("a what-if topology has no error of its own: its error is the baseline's cross-validated "
                "error plus the model's limits")


def bucket_exponent(nbytes: float) -> int:
    """Size buckets are powers of 4: the exponent of 2 rounded down to an even number."""
    return int(math.log2(max(nbytes, 1.0))) // 2 * 2


def bucket_name(op: str, exponent: int) -> str:
    return f"{op}:2^{exponent}"


class ErrorStats(Result, frozen=True):
    """Median and 90th percentile of |replayed - traced| / traced over the instances scored."""

    median: float = 0.0
    p90: float = 0.0

    @classmethod
    def of(cls, rel: np.ndarray) -> ErrorStats:
        rel = np.asarray(rel, np.float64)
        if rel.size == 0:
            return cls()
        return cls(float(np.median(rel)), float(np.percentile(rel, 90)))


class ReplayErrors(Result, frozen=True, kw_only=True):
    """The replay error of a topology, as results/replay.json gives it. `basis` is "measured" on the
    baseline; a what-if topology carries the baseline's figures with basis "baseline" and `note`
    (WHAT_IF_NOTE).

    Measured here, the error is `uncalibrated`, `in_sample` and `cross_validated`. With a
    calibration fitted on another run (`calibrated_on` names it) nothing is fitted here: the error
    is `out_of_sample` (the figure quoted), which `in_sample` and `cross_validated` also read;
    `by_op` holds the same kinds as the totals. Build one with `measured`."""

    uncalibrated: ErrorStats
    measured_in_sample: ErrorStats | UnsetType = msgspec.field(default=UNSET, name="in_sample")
    measured_cross_validated: ErrorStats | UnsetType = msgspec.field(default=UNSET, name="cross_validated")
    out_of_sample: ErrorStats | UnsetType = UNSET
    by_op: dict[str, dict[str, ErrorStats]] = msgspec.field(default_factory=dict)
    split: str = ""
    calibrated_from: str | UnsetType = msgspec.field(default=UNSET, name="calibrated_on")
    basis: str = "measured"
    note: str | UnsetType = UNSET

    @classmethod
    def measured(cls, uncalibrated: ErrorStats, in_sample: ErrorStats, cross_validated: ErrorStats,
                 by_op: Mapping[str, Mapping[str, ErrorStats]], split: str,
                 calibrated_on: str | None = None) -> ReplayErrors:
        """The baseline's error from its three figures (each op's under the KINDS names); with
        `calibrated_on`, the cross-validated figures are the out-of-sample ones (`in_sample` unused)."""
        if calibrated_on is None:
            return cls(uncalibrated=uncalibrated, measured_in_sample=in_sample,
                       measured_cross_validated=cross_validated,
                       by_op={op: dict(kinds) for op, kinds in by_op.items()}, split=split)
        return cls(uncalibrated=uncalibrated, out_of_sample=cross_validated,
                   by_op={op: {"uncalibrated": kinds["uncalibrated"], "out_of_sample": kinds["cross_validated"]}
                          for op, kinds in by_op.items()},
                   split=split, calibrated_from=calibrated_on)

    @property
    def calibrated_on(self) -> str | None:
        return self.calibrated_from if isinstance(self.calibrated_from, str) else None

    @property
    def in_sample(self) -> ErrorStats:
        return self.measured_in_sample if isinstance(self.measured_in_sample, ErrorStats) else self.quoted

    @property
    def cross_validated(self) -> ErrorStats:
        return self.quoted

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of error `by_op` holds per op, in the order they are reported."""
        return ("uncalibrated", "out_of_sample") if self.calibrated_on is not None else KINDS

    @property
    def quoted(self) -> ErrorStats:
        """The figure quoted as "replay error": cross-validated, or out of sample when the
        calibration came from another run."""
        for figure in (self.measured_cross_validated, self.out_of_sample):
            if isinstance(figure, ErrorStats):
                return figure
        return ErrorStats()

    @property
    def label(self) -> str:
        return (f"out of sample, calibrated on {self.calibrated_on}" if self.calibrated_on is not None
                else "cross-validated")

    @property
    def median(self) -> float:
        return self.quoted.median

    @property
    def p90(self) -> float:
        return self.quoted.p90

    def inherited(self) -> ReplayErrors:
        """These figures as a what-if topology carries them."""
        return msgspec.structs.replace(self, basis="baseline", note=WHAT_IF_NOTE)


class TwoTerms(Result, frozen=True):
    """The fit of one (op, algorithm) group: traced ~= latency * modelled latency + transfer *
    modelled transfer, on `n` instances spanning `buckets` size buckets."""

    latency: float
    transfer: float
    n: int = 0
    buckets: int = 0


@dataclass(frozen=True)
class Calibration:
    """Per instance: the factors applied to its modelled latency and transfer and where they came
    from (fitted, interpolated, uncalibrated, or no_flows when the model gives the instance no
    traffic), in sample and cross-validated; the fitted efficiency per bucket (the one-factor
    model, where both factors are the efficiency) and the two-term fit per group.

    `in_sample` / `cross_validated` are the transfer factors (the efficiency where one factor
    applies); `*_latency` the latency factors (None: the same as the transfer factors)."""

    efficiency: dict[str, float]
    in_sample: np.ndarray
    in_sample_source: list[str]
    cross_validated: np.ndarray
    cross_validated_source: list[str]
    split: str
    terms: dict[str, TwoTerms] = field(default_factory=dict)
    in_sample_latency: np.ndarray | None = None
    cross_validated_latency: np.ndarray | None = None

    def predict(self, latency: np.ndarray, transfer: np.ndarray, *, cross_validated: bool = False) -> np.ndarray:
        """Calibrated durations of instances with these modelled terms (ns)."""
        b = self.cross_validated if cross_validated else self.in_sample
        a = self.cross_validated_latency if cross_validated else self.in_sample_latency
        return (b if a is None else a) * latency + b * transfer


def group_name(op: str, algo: str | None) -> str:
    """The two-term group of an instance: its op and, for collectives NCCL plans, the algorithm."""
    return f"{op}:{algo}" if algo else op


def fit_two_terms(latency: np.ndarray, transfer: np.ndarray, traced: np.ndarray) -> tuple[float, float]:
    """Non-negative (a, b) minimising the sum of |a * latency + b * transfer - traced| / traced:
    iteratively reweighted least squares, each round a two-variable non-negative solve. A least
    absolute error fit passes through the bulk of the instances and ignores a few outliers (a
    stalled call), as a median does."""
    x = np.asarray(latency, np.float64) / traced
    y = np.asarray(transfer, np.float64) / traced
    w = np.ones(x.size)
    a = b = 0.0
    for _ in range(IRLS_ROUNDS):
        a_new, b_new = _nonnegative_solve(x, y, w)
        resid = np.abs(a_new * x + b_new * y - 1.0)
        done = abs(a_new - a) <= 1e-12 * max(1.0, abs(a)) and abs(b_new - b) <= 1e-12 * max(1.0, abs(b))
        a, b = a_new, b_new
        if done:
            break
        w = 1.0 / np.maximum(resid, 1e-9)
    return a, b


def _nonnegative_solve(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """argmin over a, b >= 0 of sum w (a x + b y - 1)^2."""
    sxx, syy, sxy = float(w @ (x * x)), float(w @ (y * y)), float(w @ (x * y))
    sx, sy = float(w @ x), float(w @ y)

    def loss(a: float, b: float) -> float:
        return float(w @ (a * x + b * y - 1.0) ** 2)

    candidates = [(sx / sxx if sxx > 0 else 0.0, 0.0), (0.0, sy / syy if syy > 0 else 0.0)]
    det = sxx * syy - sxy * sxy
    if det > 1e-12 * max(sxx * syy, 1e-300):
        a, b = (sx * syy - sy * sxy) / det, (sy * sxx - sx * sxy) / det
        if a >= 0 and b >= 0:
            return a, b
    return min(candidates, key=lambda ab: loss(*ab))


def _separable(latency: np.ndarray, modelled: np.ndarray, exps: np.ndarray) -> bool:
    """Whether these instances can tell a latency from a transfer factor: enough size buckets,
    and latency shares that differ."""
    if exps.size < MIN_INSTANCES or np.unique(exps).size < MIN_BUCKETS:
        return False
    share = latency / modelled
    return float(share.max() - share.min()) >= MIN_SHARE_SPREAD


def _fit(ops: Sequence[str], exps: np.ndarray, ratio: np.ndarray, train: np.ndarray) -> dict[tuple[str, int], float]:
    groups: dict[tuple[str, int], list[float]] = {}
    for k in np.nonzero(train)[0].tolist():
        groups.setdefault((ops[k], int(exps[k])), []).append(float(ratio[k]))
    return {key: float(np.median(v)) for key, v in groups.items()}


def _predict(fitted: dict[tuple[str, int], float], op: str, exp: int) -> tuple[float, str]:
    if (op, exp) in fitted:
        return fitted[op, exp], FITTED
    same = sorted(e for o, e in fitted if o == op)
    if not same:
        return 1.0, UNCALIBRATED
    lower = [e for e in same if e < exp]
    upper = [e for e in same if e > exp]
    if lower and upper:
        lo, hi = lower[-1], upper[0]
        w = (exp - lo) / (hi - lo)
        return (1 - w) * fitted[op, lo] + w * fitted[op, hi], INTERPOLATED
    return fitted[op, (lower or upper)[-1 if lower else 0]], INTERPOLATED


def _median_without(sorted_vals: np.ndarray, pos: int) -> float:
    """Median of a sorted array with the element at `pos` left out."""
    m = sorted_vals.size - 1

    def at(i: int) -> float:
        return float(sorted_vals[i if i < pos else i + 1])

    return at(m // 2) if m % 2 else 0.5 * (at(m // 2 - 1) + at(m // 2))


def calibrate(ops: Sequence[str], nbytes: np.ndarray, traced: np.ndarray, modelled: np.ndarray,
              folds: np.ndarray | None, *, latency: np.ndarray | None = None,
              algos: Sequence[str | None] | None = None) -> Calibration:
    """Factors for instances of `ops` / `nbytes` with traced and modelled durations, `latency`
    being the modelled latency part of `modelled` (None: one factor per bucket only) and `algos`
    each instance's algorithm (its two-term group with the op). `folds` (one label per instance,
    e.g. its step) selects leave-one-fold-out; None means leave one instance out."""
    n = len(ops)
    exps = np.array([bucket_exponent(b) for b in nbytes], np.int64)
    valid = (modelled > 0) & (traced > 0)
    ratio = np.where(valid, traced / np.where(valid, modelled, 1.0), np.nan)
    fitted = _fit(ops, exps, ratio, valid)
    eta_in = np.ones(n)
    src_in = [NO_FLOWS] * n
    for k in range(n):
        if valid[k]:
            eta_in[k], src_in[k] = _predict(fitted, ops[k], int(exps[k]))
    eta_cv = np.ones(n)
    src_cv = [NO_FLOWS] * n
    if folds is not None:
        for f in np.unique(folds[valid]):
            held = valid & (folds == f)
            train_fit = _fit(ops, exps, ratio, valid & ~held)
            for k in np.nonzero(held)[0].tolist():
                eta_cv[k], src_cv[k] = _predict(train_fit, ops[k], int(exps[k]))
        split = LEAVE_ONE_STEP_OUT
    else:
        members: dict[tuple[str, int], list[int]] = {}
        for k in np.nonzero(valid)[0].tolist():
            members.setdefault((ops[k], int(exps[k])), []).append(k)
        for key, ks in members.items():
            if len(ks) == 1:
                others = {b: v for b, v in fitted.items() if b != key}
                eta_cv[ks[0]], src_cv[ks[0]] = _predict(others, *key)
                continue
            order = np.argsort(ratio[ks], kind="stable")
            vals = ratio[ks][order]
            for pos, k in enumerate(np.asarray(ks)[order].tolist()):
                eta_cv[k], src_cv[k] = _median_without(vals, pos), FITTED
        split = LEAVE_ONE_INSTANCE_OUT
    cal = Calibration(efficiency={bucket_name(o, e): v for (o, e), v in sorted(fitted.items())},
                      in_sample=eta_in, in_sample_source=src_in, cross_validated=eta_cv,
                      cross_validated_source=src_cv, split=split)
    if latency is None:
        return cal
    return _two_terms(cal, [group_name(o, a) for o, a in zip(ops, algos or [None] * n, strict=True)],
                      exps, traced, modelled, np.asarray(latency, np.float64), valid, folds)


def _two_terms(cal: Calibration, groups: list[str], exps: np.ndarray, traced: np.ndarray, modelled: np.ndarray,
               latency: np.ndarray, valid: np.ndarray, folds: np.ndarray | None) -> Calibration:
    """`cal` (one factor per bucket) with the instances of separable groups given two factors,
    in sample and held out alike; held-out instances whose training part is not separable keep
    their one-factor prediction."""
    latency = np.clip(latency, 0.0, modelled)
    transfer = modelled - latency
    a_in, b_in = cal.in_sample.copy(), cal.in_sample.copy()
    a_cv, b_cv = cal.cross_validated.copy(), cal.cross_validated.copy()
    src_in, src_cv = list(cal.in_sample_source), list(cal.cross_validated_source)
    garr = np.asarray(groups, dtype=object)

    def fit(mask: np.ndarray) -> TwoTerms | None:
        idx = np.flatnonzero(mask)
        if idx.size == 0 or not _separable(latency[idx], modelled[idx], exps[idx]):
            return None
        a, b = fit_two_terms(latency[idx], transfer[idx], traced[idx])
        return TwoTerms(latency=a, transfer=b, n=int(idx.size), buckets=int(np.unique(exps[idx]).size))

    def put(held: np.ndarray, terms: TwoTerms | None, a: np.ndarray, b: np.ndarray, src: list[str]) -> None:
        if terms is None:
            return
        for k in np.flatnonzero(held).tolist():
            a[k], b[k], src[k] = terms.latency, terms.transfer, FITTED

    terms: dict[str, TwoTerms] = {}
    for g in sorted({groups[k] for k in np.flatnonzero(valid).tolist()}):
        members = valid & (garr == g)
        whole = fit(members)
        if whole is None:
            continue
        terms[g] = whole
        put(members, whole, a_in, b_in, src_in)
        if folds is not None:
            for f in np.unique(folds[members]):
                held = members & (folds == f)
                put(held, fit(members & ~held), a_cv, b_cv, src_cv)
        elif members.sum() > LOO_MAX:  # one fit per instance would cost n^2: ten folds by position
            fold = np.zeros(members.size, np.int64)
            fold[members] = np.arange(int(members.sum())) % LARGE_GROUP_FOLDS
            for f in range(LARGE_GROUP_FOLDS):
                held = members & (fold == f)
                put(held, fit(members & ~held), a_cv, b_cv, src_cv)
        else:
            for k in np.flatnonzero(members).tolist():
                held = np.zeros(members.size, bool)
                held[k] = True
                put(held, fit(members & ~held), a_cv, b_cv, src_cv)
    return replace(cal, in_sample=b_in, in_sample_latency=a_in, in_sample_source=src_in, cross_validated=b_cv,
                   cross_validated_latency=a_cv, cross_validated_source=src_cv, terms=terms)


def applied(ops: Sequence[str], nbytes: np.ndarray, modelled: np.ndarray, efficiency: Mapping[str, float],
            *, terms: Mapping[str, TwoTerms] | None = None, algos: Sequence[str | None] | None = None
            ) -> Calibration:
    """A fixed calibration: `efficiency` (a baseline's fitted buckets) and `terms` (its two-term
    fits per group, which take precedence) applied to other instances, as fitted, interpolated or
    uncalibrated like any prediction, with nothing fitted or held out (what-ifs that change the
    run itself must not be refitted to its traced durations)."""
    fitted = {}
    for name, value in efficiency.items():
        op, _, exp = name.rpartition(":2^")
        fitted[op, int(exp)] = float(value)
    n = len(ops)
    eta = np.ones(n)
    lat = np.ones(n)
    src = [NO_FLOWS] * n
    terms = dict(terms or {})
    for k in range(n):
        if modelled[k] > 0:
            two = terms.get(group_name(ops[k], (algos or [None] * n)[k]))
            if two is not None:
                lat[k], eta[k], src[k] = two.latency, two.transfer, FITTED
                continue
            eta[k], src[k] = _predict(fitted, ops[k], bucket_exponent(float(nbytes[k])))
            lat[k] = eta[k]
    return Calibration(efficiency=dict(efficiency), in_sample=eta, in_sample_source=src, cross_validated=eta.copy(),
                       cross_validated_source=list(src), split="fixed", terms=terms, in_sample_latency=lat,
                       cross_validated_latency=lat.copy())


def replay_errors(ops: Sequence[str], nbytes: np.ndarray, traced: np.ndarray, modelled: np.ndarray,
                  cal: Calibration, calibrated_on: str | None = None, *, latency: np.ndarray | None = None
                  ) -> ReplayErrors:
    """The three errors over the instances the model gives traffic, overall and per op.
    `latency`: the modelled latency part of `modelled` (None: 0). `calibrated_on`: `cal` was
    fitted on that other run (`applied`), so the error is out of sample."""
    valid = scored(traced, modelled)
    tr = np.where(valid, traced, 1.0)
    lat = np.zeros(modelled.size) if latency is None else np.clip(np.asarray(latency, np.float64), 0.0, modelled)
    rel = {"uncalibrated": np.abs(modelled - tr) / tr,
           "in_sample": np.abs(cal.predict(lat, modelled - lat) - tr) / tr,
           "cross_validated": np.abs(cal.predict(lat, modelled - lat, cross_validated=True) - tr) / tr}
    ops_arr = np.asarray(list(ops), dtype=object)
    by_op = {op: {k: ErrorStats.of(rel[k][valid & (ops_arr == op)]) for k in KINDS}
             for op in sorted({ops[k] for k in np.nonzero(valid)[0].tolist()})}
    return ReplayErrors.measured(*(ErrorStats.of(rel[k][valid]) for k in KINDS), by_op=by_op,
                                 split="out-of-sample" if calibrated_on is not None else cal.split,
                                 calibrated_on=calibrated_on)


def unseen_buckets(ops: Sequence[str], nbytes: np.ndarray, traced: np.ndarray, modelled: np.ndarray,
                   cal: Calibration) -> dict[str, str]:
    """The size buckets, among the instances `replay_errors` scores, that cross-validation had to
    fill without a fit of their own, and how (interpolated or uncalibrated), by name."""
    valid = scored(traced, modelled)
    unseen: dict[str, str] = {}
    for k in np.nonzero(valid)[0].tolist():
        if cal.cross_validated_source[k] != FITTED:
            unseen[bucket_name(ops[k], bucket_exponent(nbytes[k]))] = cal.cross_validated_source[k]
    return dict(sorted(unseen.items()))


def scored(traced: np.ndarray, modelled: np.ndarray) -> np.ndarray:
    """Which instances the replay error is measured on: traffic in the model and a traced time."""
    return (modelled > 0) & (traced > 0)
