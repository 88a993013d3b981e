"""XGBoost cost model: scores schedules so that faster ones score higher.

Targets are throughput normalized within each layer (the layer's best measured latency over
the schedule's latency, so 1.0 is that layer's best). Failed candidates (wrong, compile or
runtime error, timeout) are kept with throughput 0: the model must learn to avoid them, and
dropping them would let the search propose their neighbours again and again.

Two losses: `rank` (pairwise ranking within each layer, AutoTVM's default and the paper's)
and `reg` (squared error on the normalized throughput). Measurements of other layers (the
History's prior) train a base model once; the task's own trials then boost on top of its
margin, so transfer costs nothing per batch and the task's data corrects the prior.

The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# XGBoost's OpenMP threads spin between parallel regions by default: on a machine whose
# cores are busy (the fleet's processes, a test run) the spinning cost 5-20x the model's
# own CPU. Set before the library (and its OpenMP runtime) loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import xgboost as xgb  # noqa: E402

from kernels.spec import Precision, Target
from search.features import columns_from_schedules, schedule_features
from search.strategy import PriorTrial

# Beyond this many prior rows a deterministic sample is used: the base model's quality
# saturates long before and its training time would not fit the explorer's budget.
MAX_PRIOR_ROWS = 12000
# One thread: a task model trains on hundreds of rows, where a second thread cost more CPU
# than it saved (TCTUNE_XGB_THREADS sets it for the fleet's explorer processes).
NTHREAD = 1
# Several boosters' trees are predicted as one model (`merged`) when the rows are at least
# this many per tree of each: reading a row costs XGBoost about as much as 15 trees do
# (146,000 rows: 13 ms per booster, plus 0.8 ms per tree), and building the merged model
# about 0.15 ms per tree. So a whole space's first look at 10 trees of each bag takes one
# read instead of one per bag (5 bags: 0.1 s -> 0.065 s), and a candidate set's 90 trees do
# not pay for the merge.
MERGE_ROWS_PER_TREE = 2048
# Boosters trained in this process so far, "scratch" or "extend": the explorer's metrics
# (workers/explorer_stats.py) read how many each proposal trained.
FITS: Counter[str] = Counter()
_FITS_LOCK = threading.Lock()  # an explorer's threads train at once


def _count_fits(kind: str, boosters: int) -> None:
    with _FITS_LOCK:
        FITS[kind] += boosters


def _boost(b: xgb.Booster, dm: xgb.DMatrix, first: int, rounds: int) -> None:
    """`rounds` boosting iterations of `b` on `dm`, numbered from `first`: what
    `xgb.train` and `Booster.update` do, with the feature-name check `update` makes on every
    call done once per matrix (it was a third of a small tree's time)."""
    if rounds <= 0:
        return
    b.update(dm, iteration=first)
    lib, check = getattr(xgb.core, "_LIB", None), getattr(xgb.core, "_check_call", None)
    for i in range(first + 1, first + rounds):
        if lib is None or check is None:  # another XGBoost: its public path
            b.update(dm, iteration=i)
        else:
            check(lib.XGBoosterUpdateOneIter(b.handle, ctypes.c_int(i), dm.handle))


def normalized_throughput(median_us: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """best / latency among the ok rows (1.0 at the best), 0.0 for failures."""
    lat = np.asarray(median_us, dtype=np.float64)
    good = np.asarray(ok, dtype=bool) & np.isfinite(lat) & (lat > 0)
    if not good.any():
        return np.zeros(len(lat))
    best = lat[good].min()
    return np.where(good, best / np.where(good, lat, 1.0), 0.0)


@dataclass
class Rows:
    """A training set: features, targets and the layer each row belongs to."""

    X: np.ndarray
    y: np.ndarray
    group: np.ndarray  # int per row; rows of one layer share a group

    def __len__(self) -> int:
        return len(self.y)


def prior_rows(prior: Sequence[PriorTrial], precision: Precision, target: Target,
               max_rows: int = MAX_PRIOR_ROWS, seed: int = 0) -> Rows | None:
    """Training rows from measurements of other layers, one group per layer."""
    if not prior:
        return None
    keep = np.arange(len(prior))
    if len(prior) > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(len(prior), max_rows, replace=False))
    by_shape: dict[object, list[int]] = {}
    for i in keep:
        by_shape.setdefault(prior[i].shape, []).append(int(i))
    xs, ys, gs = [], [], []
    for g, (shape, rows) in enumerate(by_shape.items()):
        trials = [prior[i] for i in rows]
        cols = columns_from_schedules(precision, [t.schedule for t in trials])
        xs.append(schedule_features(shape, precision, target, cols))
        lat = np.array([t.median_us if t.median_us is not None else np.inf for t in trials])
        ys.append(normalized_throughput(lat, np.array([t.status == "ok" for t in trials])))
        gs.append(np.full(len(rows), g))
    return Rows(np.vstack(xs), np.concatenate(ys), np.concatenate(gs))


class CostModel:
    """XGBoost booster(s); `fit` retrains from scratch on the rows it is given.

    `bags` > 1 trains that many boosters on row and column subsamples (80%) with their own
    seeds and averages their margins: with the few dozen trials of a new task a single
    booster's top picks vary a lot with which trials it saw, and the average varies less.
    """

    def __init__(self, loss: str = "rank", rounds: int = 100, max_depth: int = 4,
                 eta: float = 0.2, seed: int = 0, bags: int = 1) -> None:
        if loss not in ("rank", "reg"):
            raise ValueError(f"unknown loss {loss!r}: rank or reg")
        self.loss = loss
        self.rounds = rounds
        self.seed = seed
        self.bags = max(1, int(bags))
        self.params: dict[str, object] = {
            "max_depth": max_depth, "eta": eta, "min_child_weight": 1.0, "lambda": 1.0,
            "subsample": 1.0, "tree_method": "hist", "max_bin": 64, "nthread": NTHREAD,
            "seed": seed, "verbosity": 0,
        }
        if loss == "rank":
            # Pairs within a layer only; several sampled pairs per row so that small
            # training sets (one batch) still give the model enough comparisons.
            self.params.update({"objective": "rank:pairwise",
                                "lambdarank_pair_method": "mean",
                                "lambdarank_num_pair_per_sample": 8})
        else:
            self.params["objective"] = "reg:squarederror"
        self.boosters: list[xgb.Booster] = []
        # The last training set the boosters saw, kept alive: XGBoost's rank objective
        # keys its cache by the address of the training set's metadata and checks nothing
        # else, so a later set allocated where a freed one was (the next boosting step's)
        # met the old cache: "rank.size() == predt.size()" aborted a proposal.
        self._dm: xgb.DMatrix | None = None

    def _dmatrix(self, rows: Rows, base_margin: np.ndarray | None) -> xgb.DMatrix:
        order = np.argsort(rows.group, kind="stable")  # ranking needs rows sorted by group
        dm = xgb.DMatrix(rows.X[order], label=rows.y[order], nthread=NTHREAD,
                         base_margin=None if base_margin is None else base_margin[order])
        if self.loss == "rank":
            dm.set_group(np.bincount(rows.group[order])[np.unique(rows.group[order])])
        return dm

    def _bag_params(self, j: int) -> dict[str, object]:
        if self.bags == 1:
            return self.params
        return {**self.params, "seed": self.seed * 1000 + j, "subsample": 0.8,
                "colsample_bytree": 0.8}

    def fit(self, rows: Rows, base_margin: np.ndarray | None = None) -> CostModel:
        dm = self._dmatrix(rows, base_margin)
        # As xgb.train(params, dm, rounds) without its callbacks (the same trees).
        self.boosters = []
        for j in range(self.bags):
            b = xgb.Booster(self._bag_params(j), [dm])
            _boost(b, dm, 0, self.rounds)
            self.boosters.append(b.reset())
        _count_fits("scratch", len(self.boosters))
        self._dm = dm
        return self

    def extended(self, rows: Rows, base_margin: np.ndarray | None = None,
                 rounds: int = 10, in_place: bool = False) -> CostModel:
        """Every booster boosted by `rounds` more trees on these rows (the rows it was
        trained on and more): the new trees fit what the model gets wrong now. A copy,
        this model left as it is; `in_place`: this model itself (no copy of its trees,
        which cost more than the new trees' training)."""
        if not self.boosters:
            raise RuntimeError("the cost model is not trained")
        dm = self._dmatrix(rows, base_margin)
        out = self if in_place else copy.copy(self)
        # A slice of every round copies the trees without Booster.copy's serialization
        # round trip (a fifth of its time); training on from it gives the same trees.
        boosters = self.boosters if in_place else [b[:b.num_boosted_rounds()]
                                                   for b in self.boosters]
        for j, b in enumerate(boosters):
            # A seed of its own per booster and step: XGBoost reseeds its sampler only when
            # the seed changes, so continuing with the stored one would sample from
            # wherever the process's generator happens to be (not reproducible). The same
            # calls as xgb.train(..., xgb_model=b) makes, without its copy of the trees.
            b.set_param({**self._bag_params(j),
                         "seed": (int(self._bag_params(j)["seed"]) + 1) * 100_003
                         + b.num_boosted_rounds()})
            _boost(b, dm, 0, rounds)
        out.boosters, out._dm = boosters, dm
        _count_fits("extend", len(boosters))
        return out

    @property
    def trees(self) -> int:
        """Boosting rounds of each booster so far."""
        return self.boosters[0].num_boosted_rounds() if self.boosters else 0

    def predict(self, X: np.ndarray, base_margin: np.ndarray | None = None) -> np.ndarray:
        """Higher is faster. Margins (the raw score), so a base model's margin adds up."""
        return self.predict_each(X, base_margin).mean(axis=0)

    def predict_each(self, X: np.ndarray, base_margin: np.ndarray | None = None,
                     since: int = 0, upto: int | None = None) -> np.ndarray:
        """(boosters, rows) margins: each bag's own opinion (their spread is the model's
        uncertainty, which the explorer can spend on exploration). since > 0: what the
        trees from round `since` on add (no intercept), to update margins kept from then.
        upto: only the trees before round `upto` (a cheap first look at many rows: the
        first trees of a boosted model carry most of its order)."""
        if not self.boosters:
            raise RuntimeError("the cost model is not trained")
        end = self.trees if upto is None else min(upto, self.trees)
        if len(self.boosters) > 1 and len(X) >= MERGE_ROWS_PER_TREE * (end - since):
            out = self._merged_margins(X, since, end)
        else:
            out = np.vstack([self._margin(b, X, since, upto) for b in self.boosters])
        return out if base_margin is None else out + base_margin

    def _merged_margins(self, X: np.ndarray, since: int, end: int) -> np.ndarray:
        """(boosters, rows) margins of trees [since, end) of every booster in one prediction:
        their trees as the outputs of one multi-target model (`merged`), so XGBoost reads
        each row once instead of once per booster. The intercepts are added here (each
        booster has its own; the merged model's are 0)."""
        out = np.asarray(merged(self.boosters, since, end).inplace_predict(
            X, predict_type="margin"), np.float64).reshape(len(X), -1).T
        if since == 0:
            out = out + np.array([[intercept(b)] for b in self.boosters])
        return out

    @staticmethod
    def _margin(b: xgb.Booster, X: np.ndarray, since: int, upto: int | None = None
                ) -> np.ndarray:
        end = b.num_boosted_rounds() if upto is None else min(upto, b.num_boosted_rounds())
        if since == 0 and end == b.num_boosted_rounds():
            return np.asarray(b.inplace_predict(X, predict_type="margin"), np.float64)
        part = np.asarray(b.inplace_predict(X, predict_type="margin",
                                            iteration_range=(since, end)), np.float64)
        if since == 0:
            return part
        # A partial range's margin still carries the model's intercept once.
        return part - intercept(b)


def intercept(b: xgb.Booster) -> float:
    """The booster's base score (its margin before any tree)."""
    config = json.loads(b.save_config())["learner"]["learner_model_param"]
    return float(str(config["base_score"]).strip("[]"))


def merged(boosters: Sequence[xgb.Booster], since: int, end: int) -> xgb.Booster:
    """One multi-target booster whose output j is trees [since, end) of boosters[j], with
    intercepts 0: a margin prediction of it is each booster's trees' sum, one row read for
    all of them. Built from the boosters' JSON (each output's trees in round order, the
    rounds interleaved as XGBoost stores a multi-target model's)."""
    models = [json.loads(bytes(b[since:end].save_raw("json"))) for b in boosters]
    trees_of = [m["learner"]["gradient_booster"]["model"]["trees"] for m in models]
    trees, info = [], []
    for r in range(end - since):
        for j, own in enumerate(trees_of):
            trees.append({**own[r], "id": len(trees)})
            info.append(j)
    out = models[0]
    learner = out["learner"]
    model = learner["gradient_booster"]["model"]
    model.update(trees=trees, tree_info=info,
                 iteration_indptr=list(range(0, len(trees) + 1, len(boosters))))
    model["gbtree_model_param"]["num_trees"] = str(len(trees))
    learner["learner_model_param"].update(num_target=str(len(boosters)),
                                          base_score=f"[{','.join(['0'] * len(boosters))}]")
    # Margins only: any objective reads the trees the same; squared error takes several
    # targets (the rank objective does not).
    learner["objective"] = {"name": "reg:squarederror",
                            "reg_loss_param": {"scale_pos_weight": "1"}}
    b = xgb.Booster(params={"nthread": NTHREAD})
    b.load_model(bytearray(json.dumps(out).encode()))
    return b


def pairwise_accuracy(pred: np.ndarray, truth: np.ndarray, max_pairs: int = 200_000,
                      seed: int = 0) -> float:
    """Fraction of pairs with different true values that the prediction orders right."""
    rng = np.random.default_rng(seed)
    n = len(truth)
    a = rng.integers(0, n, max_pairs)
    b = rng.integers(0, n, max_pairs)
    keep = truth[a] != truth[b]
    a, b = a[keep], b[keep]
    return float(np.mean((pred[a] > pred[b]) == (truth[a] > truth[b])))
