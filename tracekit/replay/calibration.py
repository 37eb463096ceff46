"""Calibration of the flow model on the baseline, and its error measured three ways.

The efficiency of an (op, size bucket) is the median of traced / modelled duration over its
instances. Its error is reported as `uncalibrated` (the raw model against the trace),
`in_sample` (fitted and scored on the same instances: optimistic by construction) and
`cross_validated` (each instance scored with an efficiency fitted without it: leave one step out
when the run has several steps, else leave one instance out). A bucket with nothing to fit from
takes the efficiency interpolated between the nearest fitted sizes of the same op (or the nearest
one), or none at all (1, the raw model) when the op has no fitted bucket; such buckets are flagged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

FITTED, INTERPOLATED, UNCALIBRATED, NO_FLOWS = "fitted", "interpolated", "uncalibrated", "no_flows"
LEAVE_ONE_STEP_OUT, LEAVE_ONE_INSTANCE_OUT = "leave-one-step-out", "leave-one-instance-out"
KINDS = ("uncalibrated", "in_sample", "cross_validated")
WHAT_IF_NOTE = ("a what-if topology has no error of its own: its error is the baseline's cross-validated "
                "error plus the model's limits")


def bucket_exponent(nbytes: float) -> int:
    """Size buckets are powers of 4: the exponent of 2 rounded down to an even number."""
    return int(math.log2(max(nbytes, 1.0))) // 2 * 2


def bucket_name(op: str, exponent: int) -> str:
    return f"{op}:2^{exponent}"


@dataclass(frozen=True)
class ErrorStats:
    """Median and 90th percentile of |replayed - traced| / traced over `n` instances."""

    median: float
    p90: float
    n: int

    @classmethod
    def of(cls, rel: np.ndarray) -> ErrorStats:
        rel = np.asarray(rel, np.float64)
        if rel.size == 0:
            return cls(0.0, 0.0, 0)
        return cls(float(np.median(rel)), float(np.percentile(rel, 90)), int(rel.size))

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "p90": self.p90}

    @classmethod
    def from_dict(cls, doc: Any) -> ErrorStats:
        return cls(float(doc.get("median") or 0.0), float(doc.get("p90") or 0.0), int(doc.get("n") or 0))


@dataclass(frozen=True)
class ReplayErrors:
    """The replay error of a topology. `basis` is "measured" on the baseline; a what-if
    topology carries the baseline's figures with basis "baseline" (see WHAT_IF_NOTE).

    With a calibration fitted on another run (`calibrated_on` names it) nothing is fitted here:
    the error is out of sample (`out_of_sample`, the figure quoted), and `in_sample` /
    `cross_validated` hold the same figures internally but are not reported."""

    uncalibrated: ErrorStats
    in_sample: ErrorStats
    cross_validated: ErrorStats
    by_op: dict[str, dict[str, ErrorStats]]
    split: str
    basis: str = "measured"
    unseen: dict[str, str] = field(default_factory=dict)
    calibrated_on: str | None = None

    @property
    def quoted(self) -> ErrorStats:
        """The figure quoted as "replay error": cross-validated, or out of sample when the
        calibration came from another run."""
        return self.cross_validated

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
        return replace(self, basis="baseline")

    def to_dict(self) -> dict[str, Any]:
        if self.calibrated_on is not None:
            kinds = {"uncalibrated": "uncalibrated", "out_of_sample": "cross_validated"}
            out = {k: getattr(self, attr).to_dict() for k, attr in kinds.items()}
            out["by_op"] = {op: {k: per[attr].to_dict() for k, attr in kinds.items()}
                            for op, per in self.by_op.items()}
            out["split"] = self.split
            out["calibrated_on"] = self.calibrated_on
            out["basis"] = self.basis
            if self.basis != "measured":
                out["note"] = WHAT_IF_NOTE
            return out
        out: dict[str, Any] = {k: getattr(self, k).to_dict() for k in KINDS}
        out["by_op"] = {op: {k: s.to_dict() for k, s in kinds.items()} for op, kinds in self.by_op.items()}
        out["split"] = self.split
        out["basis"] = self.basis
        if self.basis != "measured":
            out["note"] = WHAT_IF_NOTE
        return out

    @classmethod
    def from_dict(cls, doc: Any) -> ReplayErrors:
        """The errors `to_dict` wrote (results/replay.json), typed again."""
        if doc.get("calibrated_on") is not None:
            oos = ErrorStats.from_dict(doc.get("out_of_sample") or {})
            return cls(ErrorStats.from_dict(doc.get("uncalibrated") or {}), oos, oos,
                       by_op={op: {"uncalibrated": ErrorStats.from_dict(kinds.get("uncalibrated") or {}),
                                   "in_sample": ErrorStats.from_dict(kinds.get("out_of_sample") or {}),
                                   "cross_validated": ErrorStats.from_dict(kinds.get("out_of_sample") or {})}
                              for op, kinds in (doc.get("by_op") or {}).items()},
                       split=str(doc.get("split") or ""), basis=str(doc.get("basis") or "measured"),
                       calibrated_on=str(doc["calibrated_on"]))
        return cls(*(ErrorStats.from_dict(doc.get(k) or {}) for k in KINDS),
                   by_op={op: {k: ErrorStats.from_dict(s) for k, s in kinds.items()}
                          for op, kinds in (doc.get("by_op") or {}).items()},
                   split=str(doc.get("split") or ""), basis=str(doc.get("basis") or "measured"))


@dataclass(frozen=True)
class Calibration:
    """Per instance: the efficiency applied and where it came from (fitted, interpolated,
    uncalibrated, or no_flows when the model gives the instance no traffic), in sample and
    cross-validated; and the fitted efficiency per bucket."""

    efficiency: dict[str, float]
    in_sample: np.ndarray
    in_sample_source: list[str]
    cross_validated: np.ndarray
    cross_validated_source: list[str]
    split: str


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
              folds: np.ndarray | None) -> Calibration:
    """Efficiencies for instances of `ops` / `nbytes` with traced and modelled durations.
    `folds` (one label per instance, e.g. its step) selects leave-one-fold-out; None means
    leave one instance out."""
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
    return Calibration(efficiency={bucket_name(o, e): v for (o, e), v in sorted(fitted.items())},
                       in_sample=eta_in, in_sample_source=src_in, cross_validated=eta_cv,
                       cross_validated_source=src_cv, split=split)


def applied(ops: Sequence[str], nbytes: np.ndarray, modelled: np.ndarray, efficiency: Mapping[str, float]
            ) -> Calibration:
    """A fixed calibration: `efficiency` (a baseline's fitted buckets) applied to other instances,
    as fitted, interpolated or uncalibrated like any prediction, with nothing fitted or held out
    (what-ifs that change the run itself must not be refitted to its traced durations)."""
    fitted = {}
    for name, value in efficiency.items():
        op, _, exp = name.rpartition(":2^")
        fitted[op, int(exp)] = float(value)
    n = len(ops)
    eta = np.ones(n)
    src = [NO_FLOWS] * n
    for k in range(n):
        if modelled[k] > 0:
            eta[k], src[k] = _predict(fitted, ops[k], bucket_exponent(float(nbytes[k])))
    return Calibration(efficiency=dict(efficiency), in_sample=eta, in_sample_source=src, cross_validated=eta.copy(),
                       cross_validated_source=list(src), split="fixed")


def replay_errors(ops: Sequence[str], nbytes: np.ndarray, traced: np.ndarray, modelled: np.ndarray,
                  cal: Calibration, calibrated_on: str | None = None) -> ReplayErrors:
    """The three errors over the instances the model gives traffic, overall and per op; the
    buckets that cross-validation had to fill without a fit of their own are listed in `unseen`.
    `calibrated_on`: `cal` was fitted on that other run (`applied`), so the error is out of
    sample."""
    valid = (modelled > 0) & (traced > 0)
    tr = np.where(valid, traced, 1.0)
    rel = {"uncalibrated": np.abs(modelled - tr) / tr,
           "in_sample": np.abs(cal.in_sample * modelled - tr) / tr,
           "cross_validated": np.abs(cal.cross_validated * modelled - tr) / tr}
    ops_arr = np.asarray(list(ops), dtype=object)
    by_op = {op: {k: ErrorStats.of(rel[k][valid & (ops_arr == op)]) for k in KINDS}
             for op in sorted({ops[k] for k in np.nonzero(valid)[0].tolist()})}
    unseen: dict[str, str] = {}
    for k in np.nonzero(valid)[0].tolist():
        if cal.cross_validated_source[k] != FITTED:
            unseen[bucket_name(ops[k], bucket_exponent(nbytes[k]))] = cal.cross_validated_source[k]
    return ReplayErrors(uncalibrated=ErrorStats.of(rel["uncalibrated"][valid]),
                        in_sample=ErrorStats.of(rel["in_sample"][valid]),
                        cross_validated=ErrorStats.of(rel["cross_validated"][valid]),
                        by_op=by_op, split="out-of-sample" if calibrated_on is not None else cal.split,
                        unseen=dict(sorted(unseen.items())), calibrated_on=calibrated_on)
