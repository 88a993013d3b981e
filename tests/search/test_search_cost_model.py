"""Features and the XGBoost cost model on recorded datasets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from search.cost_model import (
    CostModel,
    Rows,
    intercept,
    normalized_throughput,
    pairwise_accuracy,
)
from search.datasets import load_dataset
from search.features import columns_from_schedules, feature_names, space_features

REPLAY = Path(__file__).resolve().parents[2] / "bench" / "data" / "replay"


def test_features_are_finite_named_and_match_row_by_row() -> None:
    space = ScheduleSpace(RESNET50_3X3["stage3"], Precision.FP16, TARGETS["h100"])
    idx = np.random.default_rng(0).choice(space.valid_indices, 300, replace=False)
    X = space_features(space, idx)
    assert X.shape == (300, len(feature_names(Precision.FP16)))
    assert np.isfinite(X).all()
    # Vectorized over many schedules == one at a time, and from dicts == from indices.
    one = np.vstack([space_features(space, np.array([i])) for i in idx[:20]])
    np.testing.assert_allclose(one, X[:20])
    from search.features import schedule_features
    cols = columns_from_schedules(Precision.FP16, space.schedules(idx[:20]))
    np.testing.assert_allclose(schedule_features(space.shape, Precision.FP16, space.target,
                                                 cols), X[:20])


def test_shape_features_tell_layers_apart_and_knob_columns_do_not_depend_on_them() -> None:
    names = feature_names(Precision.INT8)
    a = ScheduleSpace(RESNET50_3X3["stage2"], Precision.INT8, TARGETS["h100"])
    b = ScheduleSpace(RESNET50_3X3["stage5"], Precision.INT8, TARGETS["h100"])
    sched = a.schedule_at(int(a.valid_indices[100]))
    xa = space_features(a, np.array([a.index_of(sched)]))[0]
    xb = space_features(b, np.array([b.index_of(sched)]))[0]
    knob_cols = [i for i, n in enumerate(names) if not n.startswith(("d:", "s:"))]
    np.testing.assert_array_equal(xa[knob_cols], xb[knob_cols])
    shape_cols = [i for i, n in enumerate(names) if n.startswith("s:")]
    assert (xa[shape_cols] != xb[shape_cols]).sum() >= 4
    # Derived: the wider the block's M extent, the more of its 3x3 im2col rows share pixels.
    X = space_features(a, a.valid_indices)
    bm, dup = X[:, names.index("d:block_m")], X[:, names.index("d:dup_ratio")]
    assert np.median(dup[bm == bm.max()]) > 2 * np.median(dup[bm == bm.min()])


def test_normalized_throughput_keeps_failures_at_zero() -> None:
    y = normalized_throughput(np.array([10.0, 20.0, np.inf, 5.0]),
                              np.array([True, True, False, True]))
    np.testing.assert_allclose(y, [0.5, 0.25, 0.0, 1.0])
    assert not normalized_throughput(np.array([np.inf]), np.array([False])).any()


@pytest.mark.parametrize("dataset", ["sim_stage2_int8_h100_paper6", "sim_stage5_fp16_h100_wide"])
@pytest.mark.parametrize("loss", ["rank", "reg"])
def test_ranking_accuracy_on_held_out_schedules(dataset: str, loss: str) -> None:
    ds = load_dataset(REPLAY / f"{dataset}.jsonl.gz")
    v = ds.space.valid_indices
    X = space_features(ds.space, v)
    truth = ds.throughput(v)
    accs = []
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(len(v))
        train, test = perm[:200], perm[200:]
        y = normalized_throughput(ds.median_us[v[train]], np.isfinite(ds.median_us[v[train]]))
        model = CostModel(loss, seed=seed).fit(Rows(X[train], y, np.zeros(200, np.int64)))
        accs.append(pairwise_accuracy(model.predict(X[test]), truth[test]))
    assert min(accs) > 0.7, accs


def test_failed_candidates_teach_the_model_to_avoid_their_region() -> None:
    """Mark every CHUNK=1 schedule as failed: trained with the failures kept (throughput 0),
    the model scores held-out CHUNK=1 schedules below the rest."""
    ds = load_dataset(REPLAY / "sim_stage3_fp16_h100_paper6.jsonl.gz")
    v = ds.space.valid_indices
    X = space_features(ds.space, v)
    chunk1 = ds.space.columns(v)["CHUNK"] == 1
    perm = np.random.default_rng(0).permutation(len(v))
    train, test = perm[:150], perm[150:]
    ok = ~chunk1[train]
    y = normalized_throughput(np.where(ok, ds.median_us[v[train]], np.inf), ok)
    model = CostModel("rank").fit(Rows(X[train], y, np.zeros(150, np.int64)))
    pred = model.predict(X[test])
    assert np.median(pred[chunk1[test]]) < np.quantile(pred[~chunk1[test]], 0.1)


def test_base_margin_adds_a_prior_models_scores() -> None:
    ds = load_dataset(REPLAY / "sim_stage4_fp16_h100_paper6.jsonl.gz")
    v = ds.space.valid_indices[:300]
    X = space_features(ds.space, v)
    y = ds.throughput(v)
    base = np.linspace(-1, 1, len(v))
    m = CostModel("reg", rounds=5).fit(Rows(X, y, np.zeros(len(v), np.int64)), base_margin=base)
    np.testing.assert_allclose(m.predict(X, base_margin=base) - m.predict(X), base, atol=1e-5)


@pytest.mark.parametrize("bags", [1, 5])
def test_extended_model_margins_are_the_old_ones_plus_the_new_trees(bags: int) -> None:
    ds = load_dataset(REPLAY / "sim_stage4_fp16_h100_paper6.jsonl.gz")
    v = ds.space.valid_indices
    X = space_features(ds.space, v)
    y = ds.throughput(v)
    base = np.linspace(-1, 1, len(v))

    def rows(k: int) -> Rows:
        return Rows(X[:k], y[:k], np.zeros(k, np.int64))

    old = CostModel("reg", rounds=20, bags=bags, seed=3).fit(rows(64), base_margin=base[:64])
    new = old.extended(rows(200), base_margin=base[:200], rounds=7)
    assert (old.trees, new.trees) == (20, 27)  # the old model is left as it was
    np.testing.assert_allclose(
        old.predict_each(X) + new.predict_each(X, since=old.trees), new.predict_each(X),
        atol=1e-4)
    # The new trees learned from the new rows: the error there shrinks.
    err = [np.abs(m.predict(X[64:200], base_margin=base[64:200]) - y[64:200]).mean()
           for m in (old, new)]
    assert err[1] < err[0]


@pytest.mark.parametrize("loss", ["rank", "reg"])
def test_bags_predicted_as_one_merged_model_give_each_bag_margins(
        loss: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many rows per tree take the merged path (one multi-target model of every bag's
    trees); its margins are each booster's own, whole or a range of rounds."""
    from search import cost_model
    from search.cost_model import MERGE_ROWS_PER_TREE, merged

    ds = load_dataset(REPLAY / "sim_stage4_fp16_h100_paper6.jsonl.gz")
    v = ds.space.valid_indices
    X = np.ascontiguousarray(space_features(ds.space, v), dtype=np.float32)
    m = CostModel(loss, rounds=12, bags=4, seed=1).fit(
        Rows(X[:300], ds.throughput(v[:300]), np.zeros(300, np.int64)))
    for since, upto in ((0, 12), (0, 3), (3, 12), (5, 7)):
        one = np.vstack([CostModel._margin(b, X, since, upto) for b in m.boosters])
        both = np.asarray(merged(m.boosters, since, upto).inplace_predict(
            X, predict_type="margin")).T
        if since == 0:
            both = both + np.array([[intercept(b)] for b in m.boosters])
        np.testing.assert_allclose(both, one, atol=1e-5)
    calls: list[tuple[int, int]] = []

    def spy(boosters, since, end):  # type: ignore[no-untyped-def]
        calls.append((since, end))
        return merged(boosters, since, end)

    monkeypatch.setattr(cost_model, "merged", spy)
    big = np.ascontiguousarray(np.resize(X, (MERGE_ROWS_PER_TREE * 2, X.shape[1])))
    np.testing.assert_allclose(m.predict_each(big, upto=2),
                               np.vstack([CostModel._margin(b, big, 0, 2)
                                          for b in m.boosters]), atol=1e-5)
    m.predict_each(big, since=2)  # 10 trees: too few rows per tree to merge
    assert calls == [(0, 2)]


@pytest.mark.parametrize("loss", ["rank", "reg"])
def test_a_model_boosted_in_place_between_copies_keeps_training(loss: str) -> None:
    """The task model's chain: boosted in place at each step, a copy boosted further on
    more rows in between. The rank objective's cache is keyed by where the training set
    lives; a freed set's place taken by a new one must not pass for it (XGBoost aborted:
    rank.size() == predt.size(), in this very sequence)."""
    rng = np.random.default_rng(0)
    X = rng.random((400, 20)).astype(np.float32)
    y = rng.random(400)

    def rows(k: int) -> Rows:
        return Rows(X[:k], y[:k], np.zeros(k, np.int64))

    chain = CostModel(loss, rounds=30, bags=3, seed=1).fit(rows(160))
    ahead = []
    for k in range(192, 400, 32):
        chain.extended(rows(k), rounds=10, in_place=True)
        ahead.append((chain.predict_each(X), chain.extended(rows(k + 8), rounds=10)))
    assert chain.trees == 30 + 7 * 10
    for j, (then, copy) in enumerate(ahead):
        # Each copy is the chain as it was and its own trees.
        assert copy.trees == 30 + (j + 2) * 10
        np.testing.assert_allclose(then + copy.predict_each(X, since=copy.trees - 10),
                                   copy.predict_each(X), atol=1e-4)


@pytest.mark.parametrize("loss", ["rank", "reg"])
def test_fit_and_boosting_steps_grow_the_trees_xgboost_would(loss: str) -> None:
    """The model trains through XGBoost's iteration call directly (without the feature
    check of every `Booster.update`): the trees, hence the margins, are those of
    `xgb.train` and of `update` per tree."""
    import xgboost as xgb

    rng = np.random.default_rng(2)
    X = rng.random((300, 12)).astype(np.float32)
    y = rng.random(300)
    group = np.repeat(np.arange(3), 100)
    model = CostModel(loss, rounds=25, bags=3, seed=4).fit(Rows(X[:200], y[:200], group[:200]))
    grown = model.extended(Rows(X, y, group), rounds=6)
    for j, (b, g) in enumerate(zip(model.boosters, grown.boosters, strict=True)):
        params = model._bag_params(j)
        ref = xgb.train(params, model._dmatrix(Rows(X[:200], y[:200], group[:200]), None),
                        num_boost_round=25)
        np.testing.assert_array_equal(b.inplace_predict(X), ref.inplace_predict(X))
        dm = model._dmatrix(Rows(X, y, group), None)
        ref.set_param({**params, "seed": (int(params["seed"]) + 1) * 100_003 + 25})
        for i in range(6):
            ref.update(dm, iteration=i)
        np.testing.assert_array_equal(g.inplace_predict(X), ref.inplace_predict(X))
