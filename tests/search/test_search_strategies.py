"""Strategy contract: valid, unseen, distinct, deterministic, never empty while schedules
remain; transfer: a prior steers the first batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from search.datasets import ReplayDataset, load_dataset
from search.diversity import best_first, voice_pick
from search.registry import DEFAULT_STRATEGY, STRATEGIES, make_strategy
from search.replay import transfer_prior
from search.strategy import History, Trial

REPLAY = Path(__file__).resolve().parents[2] / "bench" / "data" / "replay"
ALL = sorted(STRATEGIES)
# Small annealing budgets keep the contract tests fast; the replay test runs the defaults.
FAST = {"iters": 60, "rounds": 30}
# Five bags and the extra voices past 256 trials too, as before 256.
LONG_AS_SHORT = {**FAST, "long_bags": 5, "long_voices": 1}


def _options(name: str) -> dict:
    return FAST if name in ("sa", "diversity") else {}


@pytest.fixture(scope="module")
def ds() -> ReplayDataset:
    return load_dataset(REPLAY / "sim_stage3_int8_h100_paper6.jsonl.gz")


def _history(ds: ReplayDataset, n: int, pending: int, seed: int = 0) -> History:
    """n measured trials (every 7th failed) and some pending, drawn at random."""
    rng = np.random.default_rng(seed)
    pick = rng.choice(ds.space.valid_indices, n + pending, replace=False)
    trials = []
    for j, i in enumerate(pick[:n]):
        t = ds.measure(int(i))
        trials.append(Trial(t.index, "runtime_error", None) if j % 7 == 0 else t)
    return History(trials=trials, pending={int(i) for i in pick[n:]})


def test_registry_has_the_four_strategies_and_diversity_is_default() -> None:
    assert {"random", "grid", "sa", "diversity"} <= set(STRATEGIES)
    assert DEFAULT_STRATEGY == "diversity"
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("nope", ScheduleSpace(RESNET50_3X3["stage5"], Precision.INT8,
                                            TARGETS["h100"]))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("n_trials", [0, 40, 70, 130])
def test_proposals_are_valid_unseen_distinct_and_full(ds: ReplayDataset, name: str,
                                                     n_trials: int) -> None:
    history = _history(ds, n_trials, pending=9)
    batch = make_strategy(name, ds.space, seed=3, **_options(name)).propose(history, 32)
    valid = set(ds.space.valid_indices.tolist())
    # Full, except diversity's first design (nothing measured, no prior): 24 by default.
    want = 24 if name == "diversity" and n_trials == 0 else 32
    assert len(batch) == want
    assert len(set(batch)) == want
    assert all(isinstance(i, int) for i in batch)
    assert not set(batch) & history.seen
    assert set(batch) <= valid


@pytest.mark.parametrize("name", ALL)
def test_same_seed_and_history_give_the_same_batch(ds: ReplayDataset, name: str) -> None:
    history = _history(ds, 70, pending=5, seed=1)
    a = make_strategy(name, ds.space, seed=11, **_options(name)).propose(history, 32)
    # A fresh instance (the explorer after a restart) proposes the same.
    b = make_strategy(name, ds.space, seed=11, **_options(name)).propose(history, 32)
    assert a == b
    if name != "grid":
        # The seed matters where the strategy draws at random (an empty history: all do).
        c = make_strategy(name, ds.space, seed=11, **_options(name)).propose(History(), 32)
        d = make_strategy(name, ds.space, seed=12, **_options(name)).propose(History(), 32)
        assert c != d


@pytest.mark.parametrize("name", ALL)
def test_batches_drain_the_space_and_never_come_back_empty_early(name: str) -> None:
    # A small space: stage5 int8 with all but two knobs fixed.
    space = ScheduleSpace(RESNET50_3X3["stage5"], Precision.INT8, TARGETS["h100"],
                          restrict={"BLK_ROW_WARPS": [2], "BLK_COL_WARPS": [1],
                                    "WARP_ROW_TILES": [4], "DUP_AWARE": [1], "PACK_OUT": [1],
                                    "LAYOUT": ["nhwc"], "SPLIT_K": [1], "STAGES": [3]})
    valid = space.valid_indices
    assert 20 < len(valid) < 64
    strat = make_strategy(name, space, seed=0, **_options(name))
    history = History()
    rng = np.random.default_rng(0)
    while True:
        left = len(valid) - len(history.seen)
        batch = strat.propose(history, 10)
        assert len(batch) == min(10, left)
        if not batch:
            break
        for i in batch:
            history.trials.append(Trial(i, "ok", float(rng.uniform(10, 20))))
    assert {t.index for t in history.trials} == set(valid.tolist())


@pytest.mark.parametrize("name", ["sa", "diversity"])
def test_all_failed_history_still_gives_a_full_batch(ds: ReplayDataset, name: str) -> None:
    pick = ds.space.valid_indices[:80]
    history = History(trials=[Trial(int(i), "compile_error", None) for i in pick])
    batch = make_strategy(name, ds.space, seed=0, **_options(name)).propose(history, 32)
    assert len(set(batch)) == 32 and not set(batch) & set(pick.tolist())


@pytest.mark.parametrize("name", ["sa", "diversity"])
def test_transfer_the_prior_steers_the_first_batch(name: str) -> None:
    """With other layers' measurements as the prior, the first batch (no trial of this
    layer yet) is model-guided and clearly better than a random one."""
    target = load_dataset(REPLAY / "sim_stage4_int8_h100_paper6.jsonl.gz")
    others = [load_dataset(REPLAY / f"sim_{s}_int8_h100_paper6.jsonl.gz")
              for s in ("stage2", "stage3", "stage5")]
    prior = transfer_prior(target, others)
    assert len(prior) > 2000
    strat = make_strategy(name, target.space, seed=0, **_options(name))
    batch = strat.propose(History(prior=prior), 32)
    cold = make_strategy(name, target.space, seed=0, **_options(name)).propose(History(), 32)
    got = target.throughput(np.asarray(batch))
    rand = target.throughput(np.asarray(cold))
    assert len(set(batch)) == 32
    assert got.max() > max(0.95, rand.max())
    assert np.median(got) > np.median(rand) + 0.2


def test_with_a_prior_and_no_trial_the_batch_is_the_prior_best_unseen() -> None:
    """Before the task has a model (no trial measured), the default takes the prior's best
    unseen schedules in order (the base model scored every valid one), 1 in 32 random; on
    a whole layer's space an annealing walk finds only some of them."""
    from search.strategy import PriorTrial
    from workers.backends.simulated import simulate_latency_us

    prior = []
    for stage in ("stage2", "stage4"):
        other = ScheduleSpace(RESNET50_3X3[stage], Precision.INT8, TARGETS["h100"])
        idx = np.random.default_rng(0).choice(other.valid_indices, 1500, replace=False)
        lat = simulate_latency_us(other.shape, other.precision, other.target,
                                  other.columns(idx))
        prior += [PriorTrial(other.shape, sched, "ok", float(us))
                  for sched, us in zip(other.schedules(idx), lat, strict=True)]
    space = ScheduleSpace(RESNET50_3X3["stage3"], Precision.INT8, TARGETS["h100"])
    valid = space.valid_indices
    table = make_strategy("diversity", space, seed=0, **FAST).score_table([], prior)
    assert table is not None and np.isfinite(table.scores).all()
    order = [int(i) for i in valid[np.argsort(-table.scores, kind="stable")[:100]]]
    pending = set(order[:3]) | {order[10]}
    strat = make_strategy("diversity", space, seed=0, **FAST)
    batch = strat.propose(History(prior=prior, pending=pending), 32)
    assert batch[:31] == [i for i in order if i not in pending][:31]
    assert batch[31] not in pending and len(set(batch)) == 32
    top = make_strategy("diversity", space, seed=0, pick="top", **FAST)
    walked = top.propose(History(prior=prior, pending=pending), 32)
    assert set(walked[:31]) != set(batch[:31])


def test_unseen_valid_is_the_valid_space_less_what_is_seen(ds: ReplayDataset) -> None:
    strat = make_strategy("random", ds.space, seed=0)
    valid = ds.space.valid_indices
    rng = np.random.default_rng(0)
    for n in (0, 1, 50, len(valid)):
        seen = set(rng.choice(valid, n, replace=False).tolist()) | {-5, int(valid[-1]) + 7}
        history = History(trials=[Trial(i, "ok", 1.0) for i in sorted(seen)][: n // 2],
                          pending=set(sorted(seen)[n // 2:]))
        got = strat.unseen_valid(history)
        np.testing.assert_array_equal(got, valid[~np.isin(valid, list(seen))])


def test_transfer_prior_learns_from_the_same_kind_of_data_only() -> None:
    """The simulator's h100 shares the real H100's target: a GPU-recorded dataset's prior
    must not hold simulated measurements, nor a simulated one's GPU recordings."""
    sim = load_dataset(REPLAY / "sim_stage4_int8_h100_paper6.jsonl.gz")
    sim_other = load_dataset(REPLAY / "sim_stage2_int8_h100_paper6.jsonl.gz")
    gpu = load_dataset(REPLAY / "resnet50_stage3_n8_int8_h100_wgmma.jsonl.gz")
    gpu_other = load_dataset(REPLAY / "resnet50_stage2_n8_int8_h100_wgmma.jsonl.gz")
    assert sim.space.target == gpu.space.target
    pool = [sim, sim_other, gpu, gpu_other]
    for ds, other in ((sim, sim_other), (gpu, gpu_other)):
        prior = transfer_prior(ds, pool)
        assert {p.shape for p in prior} == {other.space.shape}
        assert len(prior) == len(other.space.valid_indices)


def _spread(space: ScheduleSpace, batch: np.ndarray) -> int:
    """Sum over knobs of (most - least frequent value count) in a batch: 0 = balanced."""
    total = 0
    for name, values in space.knobs.items():
        if len(values) < 2:
            continue
        col = space.columns(batch)[name]
        counts = [int(np.sum(col == v)) for v in values]
        total += max(counts) - min(counts)
    return total


def test_coverage_first_batch_is_balanced_valid_and_seeded(ds: ReplayDataset) -> None:
    """first=coverage: the batch before any trial shows every value of every knob and is
    clearly more balanced than random draws of the valid space; still valid, distinct,
    deterministic per seed and different across seeds."""
    space = ds.space
    spreads_cov, spreads_rand = [], []
    for seed in range(5):
        strat = make_strategy("diversity", space, seed=seed, first="coverage", first_n=0)
        batch = strat.propose(History(), 32)
        assert len(set(batch)) == 32 and set(batch) <= set(space.valid_indices.tolist())
        assert batch == make_strategy("diversity", space, seed=seed,
                                      first="coverage", first_n=0).propose(History(), 32)
        cols = space.columns(np.asarray(batch))
        for name, values in space.knobs.items():
            assert set(np.unique(cols[name]).tolist()) == set(values), name
        spreads_cov.append(_spread(space, np.asarray(batch)))
        rand = make_strategy("diversity", space, seed=seed, first="random", first_n=0).propose(
            History(), 32)
        spreads_rand.append(_spread(space, np.asarray(rand)))
    assert np.median(spreads_cov) < 0.6 * np.median(spreads_rand), (spreads_cov, spreads_rand)
    a, b = (make_strategy("diversity", space, seed=k, first="coverage", first_n=0).propose(
        History(), 32) for k in (0, 1))
    assert a != b
    with pytest.raises(ValueError, match="unknown first"):
        make_strategy("diversity", space, first="nope")
    # The default is 24 random draws (chosen on the GPU-recorded spaces).
    default = make_strategy("diversity", space, seed=0).propose(History(), 32)
    assert len(default) == 24
    assert default == make_strategy("diversity", space, seed=0, first="random",
                                    first_n=24).propose(History(), 32)


@pytest.mark.parametrize("first", ["coverage", "random"])
def test_first_n_shortens_only_the_first_design(ds: ReplayDataset, first: str) -> None:
    """first_n=N: with no trial and no prior the first design is N schedules (valid,
    distinct, unmeasured; the coverage design's first N); the next call is a full batch."""
    space = ds.space
    strat = make_strategy("diversity", space, seed=2, first=first, first_n=16, **FAST)
    pending = {int(i) for i in space.valid_indices[:5]}
    first_batch = strat.propose(History(pending=pending), 32)
    assert len(first_batch) == 16 and len(set(first_batch)) == 16
    assert set(first_batch) <= set(space.valid_indices.tolist())
    assert not set(first_batch) & pending
    if first == "coverage":
        full = make_strategy("diversity", space, seed=2, first=first, first_n=0,
                             **FAST).propose(History(pending=pending), 32)
        assert len(full) == 32
        assert first_batch == full[:16]
    history = History(trials=[ds.measure(i) for i in first_batch])
    second = strat.propose(history, 32)
    assert len(second) == 32 and len(set(second)) == 32
    assert not set(second) & set(first_batch)
    assert set(second) <= set(space.valid_indices.tolist())
    # A prior makes the first batch model-guided: first_n no longer applies.
    prior = transfer_prior(ds, [load_dataset(REPLAY / "sim_stage4_int8_h100_paper6.jsonl.gz")])
    assert prior
    assert len(strat.propose(History(prior=prior), 32)) == 32
    with pytest.raises(ValueError, match="first_n"):
        make_strategy("diversity", space, first_n=-1)


def test_before_the_first_design_is_measured_proposals_draw_at_random(
        ds: ReplayDataset) -> None:
    """A fleet proposes its next rounds while the first one is measured: with fewer trials
    than the first design (no prior) nothing is trained, the batch is random draws (full,
    unseen); from first_n trials on, or with a prior, the model picks."""
    from search import cost_model

    trials = _history(ds, 30, pending=0, seed=5).trials
    strat = make_strategy("diversity", ds.space, seed=1, first_n=24, **FAST)
    fits = sum(cost_model.FITS.values())
    early = strat.propose(History(trials=trials[:10], pending={int(ds.space.valid_indices[0])}),
                          32)
    assert sum(cost_model.FITS.values()) == fits and strat.bag_scores is None
    assert len(set(early)) == 32 and int(ds.space.valid_indices[0]) not in early
    assert not {t.index for t in trials[:10]} & set(early)
    strat.propose(History(trials=trials[:24]), 32)
    assert sum(cost_model.FITS.values()) > fits and strat.bag_scores is not None
    prior = transfer_prior(ds, [load_dataset(REPLAY / "sim_stage4_int8_h100_paper6.jsonl.gz")])
    guided = make_strategy("diversity", ds.space, seed=1, first_n=24, **FAST)
    guided.propose(History(trials=trials[:10], prior=prior), 32)
    assert guided.bag_scores is not None


def test_best_first_orders_equal_scores_by_position() -> None:
    """Tree models give many schedules the same score: which of them a voice takes must not
    depend on numpy's selection algorithm."""
    scores = np.array([1.0, 3.0, 2.0, 3.0, 3.0, 0.0, 2.0, -np.inf])
    assert best_first(scores, 4).tolist() == [1, 3, 4, 2]
    assert best_first(scores, 8).tolist() == [1, 3, 4, 2, 6, 0, 5, 7]
    big = np.repeat(np.arange(50.0), 400)[np.random.default_rng(0).permutation(20000)]
    top = best_first(big, 300)
    assert (big[top] == 49.0).all() and (np.diff(top) > 0).all()


def test_voice_pick_takes_each_voice_best_in_turn() -> None:
    voices = np.array([[5.0, 4, 3, 2, 1, 0],      # the mean: prefers row 0, then 1
                       [0.0, 9, 8, 1, 1, 1],      # a bag: prefers 1, then 2
                       [-np.inf, 0, 0, 0, 0, 9]])  # only an opinion on rows 1-5: prefers 5
    free = np.array([True, True, True, True, False, True])
    # Turn 1: mean -> 0, bag -> 1, third -> 5; turn 2: mean -> 2 (0, 1 taken), bag -> 3.
    assert voice_pick(voices, free, 5).tolist() == [0, 1, 5, 2, 3]
    # Never a row that is not free, never twice; fewer free rows than asked: all of them.
    assert sorted(voice_pick(voices, free, 9).tolist()) == [0, 1, 2, 3, 5]
    # A voice with no opinion left (-inf) yields its turn to the others.
    only = np.array([[-np.inf, -np.inf, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0]])
    assert voice_pick(only, np.ones(4, bool), 3).tolist() == [3, 2, 1]


def test_diversity_batch_starts_with_the_mean_best_then_each_bag_best(
        ds: ReplayDataset) -> None:
    """The default batch after trials: the bags' mean's best unseen schedule first, and
    every bag's own best unseen schedule within the first round of picks."""
    history = _history(ds, 64, pending=5, seed=2)
    strat = make_strategy("diversity", ds.space, seed=4, **FAST)
    batch = strat.propose(history, 32)
    assert strat.bag_scores is not None and strat.bag_scores.shape == (
        5, len(ds.space.valid_indices))
    valid = ds.space.valid_indices
    unseen = ~np.isin(valid, np.fromiter(history.seen, np.int64))
    mean = strat.bag_scores.mean(axis=0)
    assert batch[0] == int(valid[np.flatnonzero(unseen)[np.argmax(mean[unseen])]])
    first_round = set(batch[:6])
    for bag in strat.bag_scores:
        assert int(valid[np.flatnonzero(unseen)[np.argmax(bag[unseen])]]) in first_round
    # Then the three rank-loss voices (trained on the trials alone): no prior, no own_voices.
    assert strat.own_scores is not None and strat.own_scores.shape == (
        3, len(ds.space.valid_indices))
    for voice in strat.own_scores:
        assert int(valid[np.flatnonzero(unseen)[np.argmax(voice[unseen])]]) in set(batch[:9])
    # The paper's pick (annealer top by the mean) is a different batch from the same model.
    # The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to
    # Optimize Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md).
    top = make_strategy("diversity", ds.space, seed=4, pick="top", **FAST).propose(history, 32)
    assert top[0] != batch[0] or set(top) != set(batch)
    with pytest.raises(ValueError, match="unknown pick"):
        make_strategy("diversity", ds.space, pick="nope")


def test_with_a_prior_the_task_trials_alone_get_voices_of_their_own() -> None:
    """With a prior, two more voices come from the task's trials alone (reg, in place of the
    rank voices of a cold start): a wrong prior cannot hold the whole batch. They answer to
    the trials only: a prior that says the opposite does not change them."""
    target = load_dataset(REPLAY / "sim_stage4_int8_h100_paper6.jsonl.gz")
    prior = transfer_prior(target, [load_dataset(REPLAY / "sim_stage2_int8_h100_paper6.jsonl.gz")])
    history = _history(target, 40, pending=0, seed=3)
    strat = make_strategy("diversity", target.space, seed=1, **FAST)
    strat.propose(History(trials=history.trials, prior=prior), 32)
    n = len(target.space.valid_indices)
    assert strat.own_scores is not None and strat.own_scores.shape == (2, n)
    flipped = [type(p)(p.shape, p.schedule, p.status,
                       None if p.median_us is None else 1e4 / p.median_us) for p in prior]
    other = make_strategy("diversity", target.space, seed=1, **FAST)
    other.propose(History(trials=history.trials, prior=flipped), 32)
    assert other.own_scores is not None
    np.testing.assert_array_equal(strat.own_scores, other.own_scores)
    assert not np.array_equal(strat.bag_scores, other.bag_scores)
    cold = make_strategy("diversity", target.space, seed=1, own_voices=0, **FAST)
    cold.propose(History(trials=history.trials, prior=prior), 32)
    assert cold.own_scores is None
    for bad in ("own_voices", "rank_voices"):
        with pytest.raises(ValueError, match=bad):
            make_strategy("diversity", target.space, **{bad: -1})


def test_diversity_task_model_is_a_function_of_the_trials(ds: ReplayDataset) -> None:
    """Trained from scratch at 32, 64, 96, 160 trials, boosted in between: a strategy that
    proposed along the way and a fresh one (the explorer after a restart) agree."""
    from search.model_based import RANK_VOICES_SALT, refit_point

    assert [refit_point(n, 1.5) for n in (32, 63, 64, 95, 96, 159, 160, 255, 256)] == \
        [32, 32, 64, 64, 96, 96, 160, 160, 256]
    trials = _history(ds, 200, pending=0, seed=2).trials
    live = make_strategy("diversity", ds.space, seed=5, **FAST)
    for n in (32, 64, 100, 128, 150):
        live.propose(History(trials=trials[:n]), 32)
    chain = live._chains[None]  # type: ignore[attr-defined]  # the task model's
    assert chain["start"] == 96 and chain["upto"] == 128
    assert chain["model"].trees == FAST["rounds"] + 10
    # The rank voices follow the same schedule, on a chain of their own.
    voices = live._chains[("rank", 3, RANK_VOICES_SALT)]  # type: ignore[attr-defined]
    assert voices["start"] == 96 and voices["model"].trees == FAST["rounds"] + 10
    h = History(trials=trials[:190])
    fresh = make_strategy("diversity", ds.space, seed=5, **FAST)
    assert live.propose(h, 32) == fresh.propose(h, 32)
    np.testing.assert_array_equal(live.own_scores, fresh.own_scores)
    np.testing.assert_array_equal(live.score_table(h.trials).scores,  # type: ignore[union-attr]
                                  fresh.score_table(h.trials).scores)  # type: ignore[union-attr]
    # refit=1: trained from scratch every time, as sa and the paper's configuration do.
    every = make_strategy("diversity", ds.space, seed=5, refit=1, **FAST)
    assert every.score_table(h.trials) is not None and None not in every._chains  # type: ignore
    assert not np.array_equal(every.score_table(h.trials).scores,  # type: ignore[union-attr]
                              fresh.score_table(h.trials).scores)  # type: ignore[union-attr]


def test_a_long_job_retrains_as_its_trials_double_with_eight_steps_between() -> None:
    """Past 256 trials the task model is trained from scratch when the trials have doubled
    and boosted every eighth of that count in between (the replay's 200 trials keep the
    schedule of every 32); still a function of the trials: a strategy that proposed along
    the way and a fresh one agree."""
    from search.model_based import RANK_VOICES_SALT, boost_step, refit_point

    assert sorted({refit_point(n, 1.5) for n in range(32, 3000)}) == \
        [32, 64, 96, 160, 256, 512, 1024, 2048]
    assert sorted({refit_point(n, 3.0) for n in range(32, 3000)}) == [32, 96, 288, 864, 2592]
    assert [boost_step(s) for s in (32, 160, 256, 512, 1024, 2048)] == [32, 32, 32, 64, 128, 256]
    wide = load_dataset(REPLAY / "sim_stage2_int8_h100_wide.jsonl.gz")
    trials = _history(wide, 700, pending=0, seed=1).trials
    live = make_strategy("diversity", wide.space, seed=2, **LONG_AS_SHORT)
    live.propose(History(trials=trials[:300]), 32)
    chain = live._chains[None]  # type: ignore[attr-defined]
    # Steps of 32 (at 288), and a copy boosted on all 300 trials for this proposal.
    assert chain["start"] == 256 and chain["upto"] == 288
    assert not np.array_equal(live.bag_scores, chain["each"])  # type: ignore[arg-type]
    for n in (530, 600, 690):
        live.propose(History(trials=trials[:n]), 32)
    chain = live._chains[None]  # type: ignore[attr-defined]
    # From scratch at 512, boosted at 576 and 640 (not at 544, 608 or 672); the proposal
    # at 690 takes the model of 640 as it is.
    assert chain["start"] == 512 and chain["upto"] == 640
    assert chain["model"].trees == FAST["rounds"] + 2 * 10
    np.testing.assert_array_equal(live.bag_scores, chain["each"])  # type: ignore[arg-type]
    voices = live._chains[("rank", 3, RANK_VOICES_SALT)]  # type: ignore[attr-defined]
    assert voices["upto"] == 640 and voices["model"].trees == FAST["rounds"] + 2 * 10
    h = History(trials=trials[:700])
    fresh = make_strategy("diversity", wide.space, seed=2, **LONG_AS_SHORT)
    assert live.propose(h, 32) == fresh.propose(h, 32)
    np.testing.assert_array_equal(live.bag_scores, fresh.bag_scores)  # type: ignore[arg-type]
    np.testing.assert_array_equal(live.own_scores, fresh.own_scores)  # type: ignore[arg-type]


def test_a_long_job_trains_three_bags_and_with_a_prior_no_own_voices() -> None:
    """From 256 trials on (the default `long_bags=3`, `long_voices=0`) the task model is
    three bags, and with a prior the own voices stop (their chain dropped); the rank voices
    of a job without a prior go on. Before 256 nothing differs from five bags with every
    voice all along."""
    from search.model_based import OWN_VOICES_SALT, RANK_VOICES_SALT

    wide = load_dataset(REPLAY / "sim_stage2_int8_h100_wide.jsonl.gz")
    prior = transfer_prior(wide, [load_dataset(REPLAY / "sim_stage3_int8_h100_paper6.jsonl.gz")])
    trials = _history(wide, 600, pending=0, seed=1).trials
    n = len(wide.space.valid_indices)
    for p, voices, key in ((prior, 2, ("reg", 2, OWN_VOICES_SALT)),
                           ([], 3, ("rank", 3, RANK_VOICES_SALT))):
        default = make_strategy("diversity", wide.space, seed=2, **FAST)
        always = make_strategy("diversity", wide.space, seed=2, **LONG_AS_SHORT)
        for k in (100, 250):
            h = History(trials=trials[:k], prior=p)
            assert default.propose(h, 32) == always.propose(h, 32)
            assert default.bag_scores.shape == (5, n)  # type: ignore[union-attr]
            assert default.own_scores.shape == (voices, n)  # type: ignore[union-attr]
        for k in (300, 560):
            h = History(trials=trials[:k], prior=p)
            default.propose(h, 32)
            always.propose(h, 32)
            assert default.bag_scores.shape == (3, n)  # type: ignore[union-attr]
            assert always.bag_scores.shape == (5, n)  # type: ignore[union-attr]
            assert always.own_scores.shape == (voices, n)  # type: ignore[union-attr]
            if p:
                assert default.own_scores is None and key not in default._chains  # type: ignore
            else:
                assert default.own_scores.shape == (3, n)  # type: ignore[union-attr]
                assert key in default._chains  # type: ignore[attr-defined]


def test_between_retrainings_the_task_model_keeps_its_base(ds: ReplayDataset) -> None:
    """A prior that moves between two trainings from scratch (a busy fleet) is taken up at
    the next one: the boosting steps go on from the base the task model was trained on.
    From 256 trials on a retraining keeps the base it has (and so the same picks as a
    strategy whose prior never moved)."""
    others = [load_dataset(REPLAY / f"sim_stage{k}_int8_h100_paper6.jsonl.gz") for k in (2, 4)]
    first = transfer_prior(ds, others[:1])
    moved = transfer_prior(ds, others)
    trials = _history(ds, 300, pending=0, seed=4).trials
    strat = make_strategy("diversity", ds.space, seed=2, **FAST)
    strat.propose(History(trials=trials[:100], prior=first), 32)  # trained from scratch at 96
    chain = strat._chains[None]  # type: ignore[attr-defined]
    base_fp = chain["base"]
    strat.propose(History(trials=trials[:130], prior=moved), 32)  # a boosting step at 128
    chain = strat._chains[None]  # type: ignore[attr-defined]
    assert chain["start"] == 96 and chain["upto"] == 128 and chain["base"] == base_fp
    strat.propose(History(trials=trials[:165], prior=moved), 32)  # from scratch at 160
    chain = strat._chains[None]  # type: ignore[attr-defined]
    assert chain["start"] == 160 and chain["base"] != base_fp
    moved_fp = chain["base"]
    again = transfer_prior(ds, others[1:])  # the prior moves once more
    still = make_strategy("diversity", ds.space, seed=2, **FAST)
    still.propose(History(trials=trials[:165], prior=moved), 32)
    for k in (260, 290):  # from scratch at 256, then a boosting step
        h = History(trials=trials[:k], prior=again)
        assert strat.propose(h, 32) == still.propose(History(trials=trials[:k], prior=moved), 32)
        chain = strat._chains[None]  # type: ignore[attr-defined]
        assert chain["start"] == 256 and chain["base"] == moved_fp


def test_boosting_steps_on_a_whole_space_update_its_shortlist() -> None:
    """On a whole layer's space (137,000 valid schedules) the steps between retrainings
    update each voice's best rows only; the rest keep their scores from the retraining."""
    from search.model_based import SHORTLIST_MIN_ROWS, SHORTLIST_ROWS
    from workers.backends.simulated import simulate_latency_us

    space = ScheduleSpace(RESNET50_3X3["stage3"], Precision.INT8, TARGETS["h100"])
    assert len(space.valid_indices) >= SHORTLIST_MIN_ROWS
    idx = np.random.default_rng(0).choice(space.valid_indices, 140, replace=False)
    lat = simulate_latency_us(space.shape, space.precision, space.target, space.columns(idx))
    trials = [Trial(int(i), "ok", float(us)) for i, us in zip(idx, lat, strict=True)]
    strat = make_strategy("diversity", space, seed=1, rank_voices=0, **FAST)
    strat.propose(History(trials=trials[:100]), 32)
    chain = strat._chains[None]  # type: ignore[attr-defined]
    rows, before = chain["rows"], chain["each"].copy()
    assert rows is not None and SHORTLIST_ROWS <= len(rows) <= 6 * SHORTLIST_ROWS
    strat.propose(History(trials=trials[:140]), 32)  # boosting steps at 128 and 140
    chain = strat._chains[None]  # type: ignore[attr-defined]
    assert chain["upto"] == 128
    after = strat.bag_scores
    assert after is not None
    outside = np.ones(len(space.valid_indices), dtype=bool)
    outside[rows] = False
    np.testing.assert_array_equal(after[:, outside], before[:, outside])
    assert not np.allclose(after[:, rows], before[:, rows])


def _whole_space_trials(n: int, seed: int = 0) -> tuple[ScheduleSpace, list[Trial]]:
    """ResNet-50 stage3 int8 on the H100 (140,175 valid schedules) and n simulated trials."""
    from workers.backends.simulated import simulate_latency_us

    space = ScheduleSpace(RESNET50_3X3["stage3"], Precision.INT8, TARGETS["h100"])
    idx = np.random.default_rng(seed).choice(space.valid_indices, n, replace=False)
    lat = simulate_latency_us(space.shape, space.precision, space.target, space.columns(idx))
    return space, [Trial(int(i), "ok", float(us)) for i, us in zip(idx, lat, strict=True)]


def test_a_retraining_on_a_whole_space_scores_its_candidate_set_only() -> None:
    """Trained from scratch on a whole layer's space, the model scores each voice's best
    by its first trees, a uniform sample and the trials with all its trees, the rest
    -inf; the batch comes from those rows, and their scores are the whole model's."""
    from search.model_based import RANDOM_ROWS, SCREEN_ROWS, SHORTLIST_MIN_ROWS, valid_rows

    space, trials = _whole_space_trials(100)
    valid = space.valid_indices
    assert len(valid) >= SHORTLIST_MIN_ROWS
    strat = make_strategy("diversity", space, seed=1, **FAST)
    batch = strat.propose(History(trials=trials), 32)  # from scratch at 96, a step at 100
    chain = strat._chains[None]  # type: ignore[attr-defined]
    model, each = chain["model"], chain["each"]
    scored = np.flatnonzero(np.isfinite(each[0]))
    assert (np.isfinite(each) == np.isfinite(each[0])).all()  # every bag the same rows
    assert SCREEN_ROWS + RANDOM_ROWS <= len(scored) <= 15_000 < len(valid) // 9
    inside, rows = valid_rows(valid, np.array([t.index for t in trials[:96]]))
    assert inside.all() and np.isin(rows, scored).all()  # the trials it learned from
    assert not np.isin(np.array([t.index for t in trials[96:]]), valid[scored]).all()
    # The chain keeps the retraining's model (the step at 100 grew a copy): its margins
    # on the candidates are the whole model's.
    assert model.trees == FAST["rounds"]
    np.testing.assert_allclose(each[:, scored], model.predict_each(strat.task_features[scored]),
                               rtol=1e-5, atol=1e-5)
    assert np.isfinite(strat.own_scores).any(axis=0).sum() < len(valid) // 9  # type: ignore
    table = strat._last_table  # type: ignore[attr-defined]
    # the random 1 of 32 aside, each pick is in the task model's set or an own voice's best
    picks = np.asarray(batch[:-1])
    own = np.isfinite(strat.own_scores[:, np.searchsorted(valid, picks)]).any(axis=0)
    assert (np.isfinite(table[picks]) | own).all()
    preds, insight = strat.describe(History(trials=trials), batch)
    assert insight is not None and np.isfinite(list(insight["knob_importance"].values())).all()
    # Every pick gets a prediction, the random one outside the set too: scored on demand
    # by the model that chose the set.
    assert len(preds) == 32 and all(np.isfinite(v) and v > 0 for v in preds.values())
    out = np.flatnonzero(~np.isfinite(table.scores))[:5]
    np.testing.assert_allclose(
        table.complete(valid[out]),
        model.predict_each(strat.task_features[out]).mean(axis=0),  # type: ignore[union-attr]
        rtol=1e-5, atol=1e-5)


def test_a_retraining_scores_every_row_on_a_small_space_and_for_the_annealer(
        ds: ReplayDataset) -> None:
    """Below the threshold (the replay's subspaces) and with the annealer's pick, which
    walks the space on the scores, a model trained from scratch scores every schedule."""
    trials = _history(ds, 100, pending=0, seed=3).trials
    strat = make_strategy("diversity", ds.space, seed=1, **FAST)
    strat.propose(History(trials=trials), 32)
    assert np.isfinite(strat._chains[None]["each"]).all()  # type: ignore[attr-defined]
    assert np.isfinite(strat.own_scores).all()  # type: ignore[arg-type]
    space, big = _whole_space_trials(40)
    top = make_strategy("diversity", space, seed=1, pick="top", **FAST)
    table = top.score_table(big)
    assert table is not None and np.isfinite(table.scores).all()


def test_candidate_sets_are_a_function_of_the_seed_and_trials() -> None:
    """A strategy that proposed along the way and a fresh one (the explorer after a
    restart) score the same candidates and propose the same batch on a whole space;
    another seed draws other candidates."""
    space, trials = _whole_space_trials(140, seed=2)
    live = make_strategy("diversity", space, seed=3, **FAST)
    for n in (64, 100, 120):
        live.propose(History(trials=trials[:n]), 32)
    h = History(trials=trials[:140])
    fresh = make_strategy("diversity", space, seed=3, **FAST)
    assert live.propose(h, 32) == fresh.propose(h, 32)
    np.testing.assert_array_equal(live.bag_scores, fresh.bag_scores)  # type: ignore[arg-type]
    np.testing.assert_array_equal(live.own_scores, fresh.own_scores)  # type: ignore[arg-type]
    other = make_strategy("diversity", space, seed=4, **FAST)
    other.propose(h, 32)
    assert not np.array_equal(np.isfinite(other.own_scores),  # type: ignore[arg-type]
                              np.isfinite(fresh.own_scores))  # type: ignore[arg-type]


def test_prior_fingerprint_follows_the_list() -> None:
    """The fingerprint is cached per list object: the same for that list and for an equal
    one, another once the list grows."""
    from search.model_based import prior_fingerprint
    from search.strategy import PriorTrial

    shape = RESNET50_3X3["stage3"]
    prior = [PriorTrial(shape, {}, "ok", float(i)) for i in range(5)]
    fp = prior_fingerprint(prior)
    assert prior_fingerprint(prior) == fp == prior_fingerprint(list(prior))
    prior.append(PriorTrial(shape, {}, "ok", 9.0))
    assert prior_fingerprint(prior) != fp
    assert prior_fingerprint(prior) == prior_fingerprint(list(prior))


def test_the_model_strategies_keep_only_the_varying_feature_columns() -> None:
    # The whole feature table is made again from the varying columns and the constants
    # (the prior's scoring), equal to the space's features; the strategy keeps half as much.
    from search.features import space_features

    space = ScheduleSpace(RESNET50_3X3["stage3"], Precision.INT8, TARGETS["h200"])
    st = make_strategy("diversity", space, seed=0)
    full = space_features(space, space.valid_indices)
    assert np.array_equal(st.features, full)  # before the split: made from the space
    task = st.task_features
    assert 0 < task.shape[1] < full.shape[1]
    assert np.array_equal(st.features, full)  # after it: made from the kept columns
    assert st.footprint() == task.nbytes  # nothing else yet; the full table is not kept
