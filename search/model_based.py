"""What the model-based strategies (sa, diversity) share: features of the space, training
the cost model on the history (and the prior, for transfer), and the score table.

Everything is a function of (seed, history): caches here only save time (the space's
features, the base model trained on a given prior), so a fresh instance after a restart
proposes exactly what the old one would have.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from kernels.space import ScheduleSpace
from search.annealing import AnnealConfig
from search.cost_model import CostModel, Rows, normalized_throughput, prior_rows
from search.features import space_features
from search.moves import Moves
from search.options import Option
from search.strategy import History, PriorTrial, Strategy, Trial

# Task rows beyond this are sampled (deterministically) before training; a task never gets
# near it in practice, but the explorer's time budget must hold whatever the history is.
MAX_TASK_ROWS = 20000

# The task model's schedule with `refit` > 1 (diversity's default): trained from scratch at
# trial counts that grow by that factor (32, 64, 96, 160, 256, ...: multiples of REFIT_STEP,
# each at least `refit` x the one before), and in between boosted by `extend` more trees per
# bag at every multiple of the step (`boost_step`) and at the count itself. Most proposals
# of a long job then train and predict a tenth of the trees. Still a function of (trials,
# prior): the steps at multiples of the step are cached, and a fresh instance redoes them.
REFIT_STEP = 32


# From a training from scratch at this many trials on (past the replay's 200), the next one
# comes when the trials have at least doubled: a retraining is most of a long job's model
# work (on a whole space about 0.5 s: 7 boosters of 100 trees, their first look at every
# schedule and their candidate set), and in a fleet whose rounds have grown to 224 nearly
# every round crossed one of 256, 384, 576, 864. Boosting steps carry the model in between.
LONG_FROM = 256


def boost_step(start: int) -> int:
    """Trials between two boosting steps after a training from scratch at `start`:
    REFIT_STEP up to LONG_FROM (the replay's 200 trials among them), then an eighth of
    `start` in multiples of REFIT_STEP (512: 64, 1024: 128, ...): eight steps per interval,
    so a long job's steps per measurement fall as its retrainings' do (every REFIT_STEP
    trials, 7 boosters x 10 trees and their shortlist's update cost about 1 ms of CPU per
    measurement whatever the job's length). With these longer steps a proposal between two
    of them takes the model of the last one as it is (`task_margins`)."""
    if start <= LONG_FROM:
        return REFIT_STEP
    return max(REFIT_STEP, start // 8 // REFIT_STEP * REFIT_STEP)


def refit_point(n: int, growth: float) -> int:
    """The last trial count <= n at which the task model is trained from scratch."""
    f = REFIT_STEP
    while True:
        g = max(growth, 2.0) if f >= LONG_FROM else growth
        nxt = max(f + REFIT_STEP, -(-int(np.ceil(f * g)) // REFIT_STEP) * REFIT_STEP)
        if nxt > n:
            return f
        f = nxt


# Spaces with at least SHORTLIST_MIN_ROWS valid schedules (whole spaces of a layer, not the
# replay's subspaces) are scored only when a model is trained from scratch, and then its
# candidate set (below); the boosting steps in between update the margins of a shortlist:
# each voice's and the mean's SHORTLIST_ROWS best at that scoring. Those steps add a few
# trees fitted on the newest trials, which move the order near the top; a schedule far
# below every voice's top is not picked before the next training from scratch
# (docs/decisions.md, "Scoring the whole space at every boosting step"). The whole space
# costs about 100 ms per 100 trees per booster on 137,000 schedules; the shortlist a tenth
# of that.
SHORTLIST_ROWS = 2048
SHORTLIST_MIN_ROWS = 16 * SHORTLIST_ROWS


def shortlist(margins: np.ndarray, k: int = SHORTLIST_ROWS) -> np.ndarray:
    """Rows (ascending) among the k best of each row of `margins` (bags, rows) and of their
    mean."""
    rows = [np.argpartition(-m, k)[:k] for m in (*margins, margins.mean(axis=0))]
    return np.unique(np.concatenate(rows))


# A model trained from scratch on such a space (for a strategy that takes its batch from
# the scored rows, `partial_scores`) scores every schedule with its first SCREEN_TREES
# trees only, and with all of them a candidate set: each voice's and the mean's
# SCREEN_ROWS best by that first look, RANDOM_ROWS uniform draws and the trials' own rows;
# the rest score -inf until the next training from scratch. Scoring the whole space with
# 7 boosters x 100 trees was most of a retraining's time and half of a long job's explorer
# CPU. The first 10 trees (eta 0.2) order the top much as all 100 do: on stage3 int8
# (137,511 valid) at 256 trials each voice's 32 best by the whole model were all among the
# candidates, its 2,048 best 86-100% (docs/decisions.md, "Scoring the whole space at a
# retraining"). A function of the seed and the trials the model learned from, as
# everything here (a restarted explorer scores the same rows).
SCREEN_TREES = 10
SCREEN_ROWS = 2 * SHORTLIST_ROWS
RANDOM_ROWS = SHORTLIST_ROWS


class ScoreTable:
    """The model's score of every index of the space (-inf where invalid, and where a
    large space's candidate set left a valid schedule unscored), stored per valid
    schedule: a dense table of a whole space (9-27 million indices) would cost 70-220 MB
    and a fill per proposal. Indexing takes space indices (scalars or arrays)."""

    def __init__(self, valid: np.ndarray, scores: np.ndarray, size: int,
                 rescore: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.valid, self.scores, self.size = valid, scores, size
        # Scores of unscored valid rows on demand (positions in `valid`), for `complete`.
        self.rescore = rescore

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        inside, pos = valid_rows(self.valid, index)
        out = np.where(inside, self.scores[pos], -np.inf)
        return float(out) if out.ndim == 0 else out

    def complete(self, indices: np.ndarray) -> np.ndarray:
        """The scores of these space indices, a valid schedule outside the candidate set
        scored now (by the model that chose the set): a few picks or measured schedules,
        not the annealer's lookups."""
        inside, pos = valid_rows(self.valid, indices)
        out = np.where(inside, self.scores[pos], -np.inf)
        missing = inside & np.isneginf(out)
        if self.rescore is not None and missing.any():
            out[missing] = self.rescore(pos[missing])
        return out


def valid_rows(valid: np.ndarray, indices: Any) -> tuple[np.ndarray, np.ndarray]:
    """(which of `indices` are in the ascending `valid`, their positions there)."""
    idx = np.asarray(indices, dtype=np.int64)
    pos = np.minimum(np.searchsorted(valid, idx), max(len(valid) - 1, 0))
    inside = (valid[pos] == idx) if len(valid) else np.zeros(idx.shape, dtype=bool)
    return inside, pos


# Seed offsets of the two sets of voices (`alone_margins`), so that their bags do not repeat
# the task model's row and column draws; also their refit chains' keys.
OWN_VOICES_SALT = 7919
RANK_VOICES_SALT = 104729

# Base models trained on a prior, shared by every strategy instance in the process:
# (target, precision, loss, fingerprint) -> model. Small: one entry per live target.
_PRIOR_CACHE: dict[tuple[Any, ...], CostModel] = {}
_PRIOR_CACHE_SIZE = 8
_PRIOR_TRAINING = threading.Lock()


# A base model's scores over the valid space, the model, and its prior's fingerprint.
Base = tuple[np.ndarray, CostModel, int]


def _trials_sig(trials: Sequence[Trial], k: int) -> int:
    return hash(tuple((t.index, t.status, t.median_us) for t in trials[:k]))


# Fingerprints of the last prior lists seen, by identity (each entry holds its list, so its
# id stays its own): the explorer hands every job of a target the same list, never changed
# once handed out (workers/history.py), and hashing 50,000 results per job and retraining
# was 1.4% of its CPU.
_FINGERPRINTS: dict[int, tuple[Sequence[PriorTrial], int, int]] = {}
_FINGERPRINTING = threading.Lock()


def prior_fingerprint(prior: Sequence[PriorTrial]) -> int:
    """In-process identity of a prior's content, cheap enough for 50,000 trials: the results
    in order (a measured median is as good as an id). Hashing every schedule dict and shape
    would cost a good part of the proposal's time budget."""
    hit = _FINGERPRINTS.get(id(prior))
    if hit is not None and hit[0] is prior and hit[1] == len(prior):
        return hit[2]
    fp = hash((len(prior), tuple(t.median_us for t in prior),
               tuple(t.status for t in prior)))
    with _FINGERPRINTING:
        while len(_FINGERPRINTS) >= _PRIOR_CACHE_SIZE:
            _FINGERPRINTS.pop(next(iter(_FINGERPRINTS)))
        _FINGERPRINTS[id(prior)] = (prior, len(prior), fp)
    return fp


MODEL_OPTIONS: tuple[Option, ...] = (
    Option("loss", str, "rank", "the cost model's loss: pairwise ranking of the trials "
           "(AutoTVM's) or regression on their normalized throughput", choices=("rank", "reg")),
    Option("rounds", int, 100, "boosting rounds of a model trained from scratch",
           minimum=1, maximum=2000),
    Option("max_depth", int, 4, "depth of each tree", minimum=1, maximum=16),
    Option("bags", int, 1, "bagged boosters of the task's model; the score is their mean",
           minimum=1, maximum=32),
    Option("long_bags", int, 3, f"with `refit` > 1: bags of a task model trained from "
           f"scratch on {LONG_FROM} trials or more (at most `bags`)", minimum=2, maximum=32),
    Option("refit", float, 1.0, "<= 1: retrain the task's model from scratch for every "
           "proposal (AutoTVM's way); > 1: only when the trials have grown by this factor "
           "(from 256 trials on, at least doubled), boosting it further in between"),
    Option("extend", int, 10, "trees each bag gains per boosting step between refits",
           minimum=1, maximum=1000),
    Option("walkers", int, 128, "simulated-annealing walkers", minimum=1, maximum=4096),
    Option("iters", int, 500, "simulated-annealing iterations at most", minimum=1,
           maximum=10000),
    Option("early_stop", int, 50, "annealing stops after this many iterations without a new "
           "candidate", minimum=1, maximum=10000),
)


class ModelBasedStrategy(Strategy):
    """Base of the strategies that rank candidates with the XGBoost cost model."""

    OPTIONS = MODEL_OPTIONS
    # Mutants per walker per annealing iteration (more need a selector: diversity's step).
    ANNEAL_MUTANTS: ClassVar[int] = 1
    # Sets of voices trained on the task's trials alone (`alone_margins`); 0 here, the
    # diversity strategy declares them as options.
    own_voices: int = 0
    rank_voices: int = 0
    long_voices: bool = True

    def __init__(self, space: ScheduleSpace, seed: int = 0, **options: Any) -> None:
        super().__init__(space, seed=seed, **options)
        o = self.options
        self.loss: str = o["loss"]
        self.rounds: int = o["rounds"]
        self.max_depth: int = o["max_depth"]
        self.bags: int = o["bags"]
        self.long_bags: int = min(o["long_bags"], o["bags"])
        self.refit: float = o["refit"]
        self.extend_rounds: int = o["extend"]
        # The refit chain of the task's model (key None) and of each set of voices.
        self._chains: dict[tuple[str, int, int] | None, dict[str, Any]] = {}
        self.anneal_cfg = AnnealConfig(walkers=o["walkers"], iters=o["iters"],
                                       early_stop=o["early_stop"], mutants=self.ANNEAL_MUTANTS)
        self._moves: Moves | None = None
        self._valid_digits: np.ndarray | None = None
        self._task_features: np.ndarray | None = None
        # Where the space's features vary, and the first row (the constant columns' values):
        # with `_task_features` they make `features` again, so the whole table is not kept.
        self._varies: np.ndarray | None = None
        self._first_row: np.ndarray | None = None
        self._prior_table: tuple[int, np.ndarray, CostModel] | None = None
        self.bag_scores: np.ndarray | None = None
        self.own_scores: np.ndarray | None = None
        # Per voice (its seed salt): the model that chose its last candidate set, its trees
        # then and its base; None where the last scoring was of every row.
        self._scored_by: dict[int, tuple[CostModel, int, Base | None] | None] = {}

    # --- cached views of the space ------------------------------------------------------
    @property
    def moves(self) -> Moves:
        if self._moves is None:
            self._moves = Moves(self.space)
        return self._moves

    @property
    def features(self) -> np.ndarray:
        """Features of every valid schedule, rows in `space.valid_indices` order. Made anew
        from `task_features` and the constant columns at each call (the prior's scoring, once
        per prior): the explorer keeps a strategy per active job, and the whole table was
        half of one's memory."""
        if self._task_features is None:
            return self._split(space_features(self.space, self.space.valid_indices))
        assert self._varies is not None and self._first_row is not None
        full = np.empty((len(self._task_features), len(self._varies)), dtype=np.float32)
        full[:] = self._first_row
        full[:, self._varies] = self._task_features
        return full

    @property
    def task_features(self) -> np.ndarray:
        """`features` without the columns that are constant over this space (a knob the
        space holds fixed, a shape feature): they cannot rank its schedules, and the task
        model's column subsampling would otherwise spend draws on them, so its picks would
        change whenever a knob is added to the kernel elsewhere. The prior's model keeps every
        column (they vary between the layers it learns from)."""
        if self._task_features is None:
            self._split(space_features(self.space, self.space.valid_indices))
        assert self._task_features is not None
        return self._task_features

    def _split(self, f: np.ndarray) -> np.ndarray:
        """Keep `f`'s varying columns as `task_features` and what makes the rest; returns f."""
        varies = (f != f[:1]).any(axis=0)  # np.ptp's answer at an eighth of its time
        if not varies.any():
            varies[:] = True
        # Row-major: XGBoost's prediction reads a column-major array at 1.7x the cost of a
        # row-major one (the same values, the same scores).
        self._task_features = np.ascontiguousarray(f[:, varies])
        self._varies, self._first_row = varies, f[0].copy()
        return f

    def footprint(self) -> int:
        """Bytes of the arrays this strategy keeps between proposals (the explorer's cache
        of strategies is bounded by their sum)."""
        arrays = [self._task_features, self._valid_digits, self.bag_scores, self.own_scores,
                  None if self._prior_table is None else self._prior_table[1],
                  None if self._moves is None else self._moves.valid]
        table = getattr(self, "_last_table", None)
        if table is not None:
            arrays.append(table.scores)
        return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))

    @property
    def partial_scores(self) -> bool:
        """Whether a model trained from scratch may leave schedules outside its candidate
        set unscored (-inf) on a large space: fine for a strategy that takes its batch
        from the scored rows, not for one that walks the space on the scores."""
        return False

    def seen_mask(self, history: History) -> np.ndarray:
        mask = np.zeros(self.space.size, dtype=bool)
        seen = list(history.seen)
        if seen:
            mask[np.asarray(seen, dtype=np.int64)] = True
        return mask

    # --- the model ----------------------------------------------------------------------
    def _new_model(self, bags: int = 1, loss: str | None = None, salt: int = 0) -> CostModel:
        return CostModel(loss or self.loss, rounds=self.rounds, max_depth=self.max_depth,
                         seed=self.seed + salt, bags=bags)

    def base_model(self, prior: Sequence[PriorTrial], fp: int | None = None
                   ) -> CostModel | None:
        """The base model trained on the prior (None where it teaches nothing): one training
        per prior and model settings in the process, whichever strategy asks first; a thread
        that asks meanwhile waits for it."""
        fp = prior_fingerprint(prior) if fp is None else fp
        key = (self.space.target.name, self.space.precision.value, self.loss, self.rounds,
               self.max_depth, fp)
        model = _PRIOR_CACHE.get(key)
        if model is None:
            with _PRIOR_TRAINING:
                model = _PRIOR_CACHE.get(key)
                if model is None:
                    rows = prior_rows(prior, self.space.precision, self.space.target)
                    if rows is None or not (rows.y > 0).any():
                        return None
                    model = self._new_model().fit(rows)
                    while len(_PRIOR_CACHE) >= _PRIOR_CACHE_SIZE:
                        _PRIOR_CACHE.pop(next(iter(_PRIOR_CACHE)))
                    _PRIOR_CACHE[key] = model
        return model

    def warm_prior(self, prior: Sequence[PriorTrial]) -> None:
        """Train the base model of a prior this strategy will be handed (the explorer does
        it in the background, off the proposals' path)."""
        if prior:
            self.base_model(prior)

    def prior_scores(self, prior: Sequence[PriorTrial], fp: int | None = None,
                     keep: bool = False) -> Base | None:
        """The base model trained on the prior, its scores over the valid space and the
        prior's fingerprint. `keep`: the scores this strategy holds already, whatever prior
        they came from."""
        if not prior:
            return None
        if keep and self._prior_table is not None:
            held_fp, table, model = self._prior_table
            return table, model, held_fp
        fp = prior_fingerprint(prior) if fp is None else fp
        if self._prior_table is not None and self._prior_table[0] == fp:
            return self._prior_table[1], self._prior_table[2], fp
        model = self.base_model(prior, fp)
        if model is None:
            return None
        table = model.predict(self.features)
        self._prior_table = (fp, table, model)
        return table, model, fp

    def score_table(self, trials: Sequence[Trial], prior: Sequence[PriorTrial] = (),
                    prior_fp: int | None = None) -> ScoreTable | None:
        """Model score of every index of the space (-inf where invalid), trained on these
        trials and the prior; None when there is nothing to learn from yet."""
        # Between two trainings from scratch the task model keeps the base it was trained
        # on top of: a prior that moved meanwhile (a busy fleet writes all the time) is
        # taken up at the next one, instead of retraining every job's model on each move.
        # From LONG_FROM trials on, not even then: the task model has learned this layer
        # from its own trials more than from the prior, and scoring the whole space with a
        # new base model at every retraining (0.3 s a job) was a sixth of a fleet's
        # explorer CPU.
        base = self._chain_base(trials) if prior else None
        if base is None:
            base = self.prior_scores(prior, prior_fp, keep=len(trials) >= LONG_FROM)
        bag_scores = None
        own = None
        each = self.task_margins(trials, base)
        if each is not None:
            if base is not None:
                each = each + base[0]
            own = each.mean(axis=0)
            bag_scores = each if len(each) > 1 else None
        scores = own if own is not None else (None if base is None else base[0])
        if scores is None:
            return None
        rescore = None
        by = self._scored_by.get(0)
        if own is not None and by is not None and not np.isfinite(scores).all():
            model, trees, b = by

            def rescore(rows: np.ndarray) -> np.ndarray:
                mean = model.predict_each(self.task_features[rows], upto=trees).mean(axis=0)
                return mean if b is None else mean + b[0][rows]  # type: ignore[no-any-return]

        table = ScoreTable(self.space.valid_indices, scores, self.space.size, rescore)
        self._last_table = table
        # Each bag's scores over the valid schedules (rows in valid_indices order), for
        # strategies that explore where the bags disagree; None with a single booster.
        self.bag_scores = bag_scores
        # From LONG_FROM trials on the task model has learned this layer from its own
        # trials more than from the prior, and the own voices (without `long_voices`) cost
        # more than they find; the rank voices' other loss still finds ways out of traps.
        own = self.long_voices or len(trials) < LONG_FROM or self.refit <= 1
        if not own:
            self._chains.pop((self.loss, self.own_voices, OWN_VOICES_SALT), None)
        self.own_scores = (
            self.alone_margins(trials, self.loss, self.own_voices * own, OWN_VOICES_SALT)
            if base is not None
            else self.alone_margins(trials, "rank", self.rank_voices, RANK_VOICES_SALT))
        return table

    def alone_margins(self, trials: Sequence[Trial], loss: str, bags: int, salt: int
                      ) -> np.ndarray | None:
        """(bags, valid schedules) margins of boosters trained on the task's trials alone,
        without the prior; None with nothing to learn from.

        Why: every bag of the task's model learns from the same trials with the same loss,
        so where those trials have not looked the bags agree, and when they are wrong there
        the whole batch is. Opinions with another inductive bias disagree there instead:
        - with a prior (`own_voices`): the task's model learns on top of the prior's margin,
          and a few dozen trials cannot overturn a prior that is confidently wrong about
          this layer (a transfer replay sat at 0.85 of the best for 60 trials); these
          answer to this layer's trials only.
        - the pairwise rank loss (`rank_voices`): it learns the order of the trials rather
          than their distance from the best, and so ranks the unseen schedules differently.
        On the task model's refit schedule (`task_margins`); they see a job's trials, never
        the prior."""
        return self.task_margins(trials, None, (loss, bags, salt)) if bags else None

    def task_rows(self, trials: Sequence[Trial], base: Base | None
                  ) -> tuple[Rows, np.ndarray | None] | None:
        """The task model's training rows (and their base margins) from these trials; None
        when none of them is a measured schedule of today's space."""
        ok = np.array([t.status == "ok" and t.median_us is not None for t in trials], bool)
        if not len(trials) or not ok.any():
            return None
        idx = np.array([t.index for t in trials], dtype=np.int64)
        lat = np.array([t.median_us if t.median_us is not None else np.inf for t in trials])
        if len(idx) > MAX_TASK_ROWS:
            keep = np.sort(np.random.default_rng(self.seed).choice(
                len(idx), MAX_TASK_ROWS, replace=False))
            idx, lat, ok = idx[keep], lat[keep], ok[keep]
        # Trials outside today's valid space (the space changed since) cannot be rows.
        inside, rows = valid_rows(self.space.valid_indices, idx)
        rows, lat, ok = rows[inside], lat[inside], ok[inside]
        if not ok.any():
            return None
        y = normalized_throughput(lat, ok)
        return (Rows(self.task_features[rows], y, np.zeros(len(y), dtype=np.int64)),
                None if base is None else base[0][rows])

    def score_new(self, model: CostModel, trials: Sequence[Trial], base: Base | None,
                  salt: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
        """(bags, valid schedules) margins of a model just trained from scratch on these
        trials, and the rows it scored with every tree (None: all of them). On a space of
        SHORTLIST_MIN_ROWS or more (`partial_scores`): the candidate set (SCREEN_TREES
        above); elsewhere every row, as before."""
        X = self.task_features
        if not self.partial_scores or len(X) < SHORTLIST_MIN_ROWS or \
                model.trees <= SCREEN_TREES:
            self._scored_by[salt] = None
            return model.predict_each(X), None
        screen = model.predict_each(X, upto=SCREEN_TREES)
        # The rows are chosen on the score the batch pick sees (the base's margin added).
        top = shortlist(screen if base is None else screen + base[0], SCREEN_ROWS)
        # Uniform draws keep some breadth in the set (and in what the knob importance
        # sees); their generator is the seed's, the trial count's and the voice's.
        drawn = np.random.default_rng([self.seed, len(trials), salt]).choice(
            len(X), RANDOM_ROWS, replace=False)
        inside, own = valid_rows(self.space.valid_indices,
                                 np.array([t.index for t in trials], dtype=np.int64))
        rows = np.unique(np.concatenate([top, drawn, own[inside]]))
        each = np.full(screen.shape, -np.inf)
        each[:, rows] = screen[:, rows] + model.predict_each(X[rows], since=SCREEN_TREES)
        # Its first trees stay as they are while the chain grows it (predictions of picks
        # outside the set: `ScoreTable.complete`).
        self._scored_by[salt] = (model, model.trees, base)
        return each, rows

    def _fit_task(self, trials: Sequence[Trial], base: Base | None,
                  voice: tuple[str, int, int] | None = None) -> CostModel | None:
        data = self.task_rows(trials, base)
        if data is None:
            return None
        # The task's own model is bagged (its data are few); the prior's is not.
        loss, bags, salt = voice or (self.loss, self.bags_at(len(trials)), 0)
        return self._new_model(bags, loss, salt).fit(*data)

    def bags_at(self, trials: int) -> int:
        """Bags of the task model trained from scratch on this many trials: fewer in a
        long job (`long_bags`), where a bag's own draw of the trials matters less and
        training and scoring each bag is most of the explorer's work."""
        return self.long_bags if trials >= LONG_FROM and self.refit > 1 else self.bags

    def task_margins(self, trials: Sequence[Trial],
                     base: Base | None,
                     voice: tuple[str, int, int] | None = None) -> np.ndarray | None:
        """(bags, valid schedules) margins of the task's own model, trained on these trials
        on top of the base (not included); None with nothing to learn from. `voice`
        (loss, bags, seed salt): a set of voices instead, on the same refit schedule."""
        n = len(trials)
        salt = 0 if voice is None else voice[2]
        if self.refit <= 1 or n < REFIT_STEP:
            model = self._fit_task(trials, base, voice)
            return None if model is None else self.score_new(model, trials, base, salt)[0]
        start, last, step = self.schedule(n)
        base_id = None if base is None else base[2]
        c = self._chains.get(voice)
        if not (c and c["base"] == base_id and self._chain_continues(c, trials)):
            model = self._fit_task(trials[:start], base, voice)
            if model is None:  # nothing measured by the refit point: no chain yet
                self._chains.pop(voice, None)
                model = self._fit_task(trials, base, voice)
                return None if model is None else self.score_new(model, trials, base,
                                                                 salt)[0]
            each, scored = self.score_new(model, trials[:start], base, salt)
            rows = None
            if scored is not None:  # of a candidate set only its rows can make it
                rows = scored[shortlist(each[:, scored] if base is None
                                        else each[:, scored] + base[0][scored])]
            elif len(each[0]) >= SHORTLIST_MIN_ROWS:
                rows = shortlist(each if base is None else each + base[0])
            c = {"base": base_id, "base_scores": base, "start": start, "upto": start,
                 "model": model, "each": each, "rows": rows,
                 "X": None if rows is None else self.task_features[rows]}
        model, each, upto, rows = c["model"], c["each"], c["upto"], c["rows"]
        # A trial count between two steps grows a copy by a step on every trial (the newest
        # learned at once) while steps are REFIT_STEP apart; past that (n >= 2 LONG_FROM),
        # the last step's model serves until the next one: it has seen all but less than
        # an eighth of the trials, and a copy per proposal was most of a long job's work.
        partial = n > last and step == REFIT_STEP
        steps = [*range(upto + step, last + 1, step), *([n] if partial else [])]
        if steps and rows is not None:
            each = each.copy()  # the chain's margins stay as they were at `upto`
        # Stored again below: a step that fails midway leaves no chain whose model has
        # trees its margins lack.
        self._chains.pop(voice, None)
        for k in steps:
            since = model.trees
            # Steps the chain keeps grow its model in place; the last one, at a trial count
            # between two steps, grows a copy (the next proposal goes on from the chain).
            model = model.extended(*self.task_rows(trials[:k], base),  # type: ignore[misc]
                                   rounds=self.extend_rounds, in_place=k <= last)
            if rows is None:
                each = each + model.predict_each(self.task_features, since=since)
            else:
                each[:, rows] += model.predict_each(c["X"], since=since)
            if k <= last:
                c = {**c, "upto": k, "model": model,
                     "each": each if rows is None else each.copy()}
        self._chains[voice] = {**c, "sig": _trials_sig(trials, c["upto"])}
        return each

    def schedule(self, n: int) -> tuple[int, int, int]:
        """At n trials (`refit` > 1): the last training from scratch, the last boosting
        step the chain keeps (a multiple of the step after it) and the step."""
        start = refit_point(n, self.refit)
        step = boost_step(start)
        return start, start + (n - start) // step * step, step

    def _chain_continues(self, c: dict[str, Any], trials: Sequence[Trial]) -> bool:
        """Whether the chain `c` serves these trials: no training from scratch is due and
        the trials it was boosted on are still the first ones."""
        start, last, _ = self.schedule(len(trials))
        return bool(c["start"] == start and c["upto"] <= last
                    and c["sig"] == _trials_sig(trials, c["upto"]))

    def _chain_base(self, trials: Sequence[Trial]) -> Base | None:
        """The base the task model's chain was trained on, while that chain goes on; None
        when it does not (the caller then takes the current prior's)."""
        c = self._chains.get(None)
        if self.refit <= 1 or len(trials) < REFIT_STEP or c is None:
            return None
        if c["base_scores"] is None or not self._chain_continues(c, trials):
            return None
        return c["base_scores"]  # type: ignore[no-any-return]

    # --- what the model thinks, for people ------------------------------------------------
    def predicted_latency(self, history: History, picks: Sequence[int]
                          ) -> tuple[dict[int, float], int]:
        """The last proposal's score of each pick mapped to microseconds by a log-linear fit
        on this task's measured schedules, and how many measurements the fit used (0: too
        few to fit, no predictions)."""
        table = getattr(self, "_last_table", None)
        if table is None:
            return {}, 0
        done = [(t.index, t.median_us) for t in history.trials
                if t.status == "ok" and t.median_us]
        if len(done) < 3:
            return {}, 0
        x = table.complete(np.array([i for i, _ in done], dtype=np.int64))
        y = np.log(np.array([us for _, us in done]))
        fit = np.isfinite(x)
        x, y = x[fit], y[fit]
        if len(x) < 3 or np.ptp(x) == 0:
            return {}, 0
        a, b = np.polyfit(x, y, 1)
        pick = np.asarray(picks, dtype=np.int64)
        score = table.complete(pick)
        return ({int(i): round(float(np.exp(a * v + b)), 3) for i, v in zip(pick, score,
                                                                              strict=True)
                 if np.isfinite(v)}, len(x))

    def describe(self, history: History, picks: Sequence[int]
                 ) -> tuple[dict[int, float], dict[str, Any] | None]:
        """After a proposal: the model's predicted latency of each pick (`predicted_latency`)
        and each knob's importance (how far the model's mean score moves across the knob's
        values)."""
        table = getattr(self, "_last_table", None)
        if table is None:
            return {}, None
        if self._valid_digits is None:  # each valid schedule's value position per knob
            self._valid_digits = self.space.digits(self.space.valid_indices).astype(np.int8)
        d, scores = self._valid_digits, table.scores
        scored = np.isfinite(scores)  # a large space's candidate set, or every row
        if not scored.all():
            d, scores = d[scored], scores[scored]
        spread = {}
        for i, name in enumerate(self.space.names):
            counts = np.bincount(d[:, i], minlength=int(self.space.radices[i]))
            sums = np.bincount(d[:, i], weights=scores, minlength=len(counts))
            means = sums[counts > 0] / counts[counts > 0]
            spread[name] = float(np.ptp(means)) if len(means) > 1 else 0.0
        total = sum(spread.values()) or 1.0
        insight: dict[str, Any] = {
            "knob_importance": {k: round(v / total, 4) for k, v in spread.items()},
            "model": f"xgboost {self.loss}", "trained_on": len(history.trials),
            "prior": len(history.prior)}
        preds, points = self.predicted_latency(history, picks)
        if points:
            insight["calibration_points"] = points
        return preds, insight

    # --- filling a batch -----------------------------------------------------------------
    def fill_random(self, picks: list[int], history: History, n: int,
                    rng: np.random.Generator) -> list[int]:
        """Top up `picks` to n with random unseen valid schedules (distinct)."""
        if len(picks) >= n:
            return picks[:n]
        left = self.unseen_valid(history)
        if picks:
            left = left[~np.isin(left, np.asarray(picks, dtype=np.int64))]
        extra = rng.choice(left, size=min(n - len(picks), len(left)), replace=False)
        return picks + [int(i) for i in extra]
