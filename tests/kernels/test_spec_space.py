"""The domain contracts: shapes, targets, the schedule space's indexing and validity."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.space import (
    PAPER_KNOBS,
    ScheduleSpace,
    field_pixels,
    geometry,
    is_valid,
    knobs_for,
    layer_traits,
    schedule_hash,
    schedule_problems,
)
from kernels.spec import (
    RESNET50_3X3,
    TARGETS,
    ConvShape,
    Precision,
    get_target,
    instruction_shape,
    target_for_gpu_model,
    task_key,
)

STAGE2 = RESNET50_3X3["stage2"]


def test_output_extent_follows_the_conv_formula() -> None:
    s = ConvShape(2, 17, 23, 8, 16, 3, 5, stride=(2, 3), pad=(1, 2), dilation=(2, 1))
    assert s.p == (17 + 2 - 2 * 2 - 1) // 2 + 1
    assert s.q == (23 + 4 - 1 * 4 - 1) // 3 + 1
    assert (s.gemm_m, s.gemm_n, s.gemm_k) == (2 * s.p * s.q, 16, 3 * 5 * 8)
    assert STAGE2.flops == 2 * 8 * 56 * 56 * 64 * 64 * 9


def test_key_is_canonical_and_roundtrips() -> None:
    a = ConvShape(8, 56, 56, 64, 64, 3, 3, pad=1)
    b = ConvShape.from_dict(a.to_dict())
    assert a == b and a.key() == b.key() and a.short_hash() == b.short_hash()
    assert a.key() != ConvShape(8, 56, 56, 64, 64, 3, 3, pad=(1, 0)).key()
    assert task_key(a, Precision.INT8, TARGETS["h200"]).endswith("|int8|h200")
    c = ConvShape(2, 17, 23, 8, 16, 3, 5, stride=(2, 3), pad=(1, 2), dilation=(2, 1))
    assert ConvShape.from_key(a.key()) == a and ConvShape.from_key(c.key()) == c
    with pytest.raises(ValueError, match="not a layer key"):
        ConvShape.from_key(a.key() + "|int8")


@pytest.mark.parametrize("shape,field", [
    (ConvShape(0, 8, 8, 8, 8, 3, 3), "n"),
    (ConvShape(1, 8, 8, 8, 8, 3, 3, stride=(0, 1)), "stride"),
    (ConvShape(1, 2, 2, 8, 8, 3, 3), "shape"),
    (ConvShape(1, 8, 8, 8, 8, 99, 3), "r"),
])
def test_problems_name_the_field(shape: ConvShape, field: str) -> None:
    assert field in [f for f, _ in shape.problems()]


def test_channel_rules_per_precision() -> None:
    odd = ConvShape(1, 8, 8, 3, 8, 3, 3, pad=1)
    assert [f for f, _ in odd.problems(Precision.INT4)] == ["c"]
    assert odd.problems(Precision.INT8) == [] and odd.problems(Precision.FP16) == []


def test_memory_rule_depends_on_the_target() -> None:
    big = ConvShape(256, 256, 256, 120, 120, 3, 3, pad=1)
    assert any("GiB" in m for _, m in big.problems(Precision.FP32_TC, TARGETS["t4"]))
    assert big.problems(Precision.FP32_TC, TARGETS["h200"]) == []


def test_targets_and_instruction_table() -> None:
    assert {t: TARGETS[t].sm for t in TARGETS} == {
        "t4": 75, "a100": 80, "a10": 86, "l4": 89, "h100": 90, "h200": 90}
    assert instruction_shape(Precision.FP16, 75).name == "m16n8k8"
    assert instruction_shape(Precision.INT8, 75).name == "m8n8k16"
    assert instruction_shape(Precision.INT8, 90).name == "m16n8k32"
    assert instruction_shape(Precision.INT4, 80).name == "m16n8k64"
    # Hopper has no 4-bit unit: the kernel unpacks int4 to s8 and runs the s8 instruction.
    assert instruction_shape(Precision.INT4, 90).name == "m16n8k32"
    assert TARGETS["h100"].peak("int4") == TARGETS["h100"].peak("int8")
    assert TARGETS["t4"].peak("int4") == 2 * TARGETS["t4"].peak("int8")
    assert get_target("H200").name == "h200"
    with pytest.raises(ValueError):
        get_target("v100")
    assert target_for_gpu_model("NVIDIA H100 80GB HBM3").name == "h100"
    assert target_for_gpu_model("NVIDIA A100-SXM4-80GB").name == "a100"
    assert target_for_gpu_model("NVIDIA A10").name == "a10"
    assert target_for_gpu_model("Tesla T4").name == "t4"
    assert target_for_gpu_model("NVIDIA H200").name == "h200"
    assert target_for_gpu_model("GeForce GTX 1080") is None


@pytest.mark.parametrize("precision", list(Precision))
def test_space_index_roundtrip_and_validity_agree(precision: Precision) -> None:
    space = ScheduleSpace(STAGE2, precision, TARGETS["h100"])
    assert set(PAPER_KNOBS) <= set(space.knobs)
    assert ("SPLIT" in space.knobs) == (precision is Precision.FP32_TC)
    rng = np.random.default_rng(0)
    valid = set(space.valid_indices.tolist())
    indices = rng.choice(space.size, 300, replace=False)
    cols, digits = space.columns(indices), space.digits(indices)
    for j, idx in enumerate(indices):
        sched = space.schedule_at(int(idx))
        assert space.index_of(sched) == idx
        # The array decodings agree with the one-at-a-time one, whose values are plain
        # Python (they go out as JSON).
        assert all(type(v) in (int, str) for v in sched.values())
        assert {n: cols[n][j] for n in space.names} == sched
        assert digits[j].tolist() == [space.knobs[n].index(sched[n]) for n in space.names]
        assert schedule_problems(precision, sched) == []
        assert space.is_valid(sched) == (int(idx) in valid)
        assert is_valid(STAGE2, precision, sched, TARGETS["h100"]) == (int(idx) in valid)
    assert 0 < len(valid) < space.size


# Few-channel stem (FOLD_TAPS), a strided 1x1 with K not a multiple of 16 bytes of int4
# (TMA stores), a batch NHWCnc cannot block, a ResNet 3x3 (HALO) and a layer over two
# inputs (the concat rule reads a tile knob).
ENUMERATED = [ConvShape(1, 224, 224, 3, 64, 7, 7, stride=(2, 2), pad=(3, 3)),
              ConvShape(3, 14, 14, 24, 40, 1, 1, stride=(2, 2)), STAGE2,
              ConvShape(2, 9, 11, 96, 40, 1, 1, stride=2, concat=32)]


@pytest.mark.parametrize("target", ["t4", "a100", "h100"])
@pytest.mark.parametrize("precision", list(Precision))
def test_pruned_enumeration_equals_every_schedule_checked(precision: Precision,
                                                          target: str) -> None:
    # valid_indices filters the structural product first; it must find exactly what the
    # full rules accept over the whole product (tile knobs narrowed to keep this quick:
    # every structural combination is still there).
    tiles = {"BLK_ROW_WARPS": [1, 4], "BLK_COL_WARPS": [2], "WARP_ROW_TILES": [1, 8],
             "WARP_COL_TILES": [2, 4], "CHUNK": [1, 8]}
    for shape in ENUMERATED:
        space = ScheduleSpace(shape, precision, TARGETS[target], restrict=tiles)
        every = np.arange(space.size)
        assert np.array_equal(space.valid_indices, every[space.valid_mask(every)])


@pytest.mark.parametrize("precision", list(Precision))
def test_layers_of_the_same_traits_share_their_structural_survivors(precision: Precision
                                                                   ) -> None:
    # The structural rules read a layer's traits only (they take nothing else), so a layer
    # enumerated after another of the same traits starts from the first one's survivors:
    # the same valid schedules as enumerated from nothing.
    from kernels import space as space_module

    pairs = [(STAGE2, ConvShape(16, 30, 30, 128, 192, 3, 3, pad=(1, 1))),
             (ConvShape(8, 56, 56, 64, 256, 1, 1), ConvShape(16, 7, 7, 512, 2048, 1, 1)),
             (ConvShape(1, 224, 224, 3, 64, 7, 7, stride=(2, 2), pad=(3, 3)),
              ConvShape(2, 100, 60, 3, 32, 5, 5, stride=(2, 2), pad=(2, 2)))]
    for first, second in pairs:
        assert layer_traits(first, precision) == layer_traits(second, precision)
        # Neither layer enumerated already (by an earlier test), or the second would not
        # reach the survivors at all.
        space_module._STRUCTURAL_CACHE.clear()
        space_module._VALID_CACHE.clear()
        assert len(ScheduleSpace(first, precision, TARGETS["h100"]).valid_indices) > 0
        warm = ScheduleSpace(second, precision, TARGETS["h100"]).valid_indices
        assert len(space_module._STRUCTURAL_CACHE) == 1  # the second layer's was the first's
        space_module._STRUCTURAL_CACHE.clear()
        space_module._VALID_CACHE.clear()
        cold = ScheduleSpace(second, precision, TARGETS["h100"]).valid_indices
        assert np.array_equal(warm, cold) and len(cold) > 0


def test_mutation_changes_exactly_one_knob() -> None:
    space = ScheduleSpace(STAGE2, Precision.INT8, TARGETS["h100"])
    rng = np.random.default_rng(1)
    for idx in rng.choice(space.valid_indices, 100):
        a, b = space.schedule_at(int(idx)), space.schedule_at(space.mutate_index(int(idx), rng))
        assert sum(a[k] != b[k] for k in a) == 1


def test_restricted_space_holds_only_the_subspace() -> None:
    fixed = {"DUP_AWARE": [1], "PACK_OUT": [1], "LAYOUT": ["nhwc"], "STAGES": [2],
             "SPLIT_K": [1], "MMA": ["sync"], "TMA": [0], "FOLD_TAPS": [0],
             "PERSIST": [0], "PLAIN_A": [0], "PINGPONG": [0], "HALO": [0], "SWAP_AB": [0],
             "SPLIT_CLUSTER": [0]}
    space = ScheduleSpace(STAGE2, Precision.INT8, TARGETS["h100"], restrict=fixed)
    assert space.size == 3 * 3 * 4 * 4 * 4 * 2
    for sched in space.schedules(space.valid_indices[:50]):
        assert all(sched[k] == v[0] for k, v in fixed.items())
    with pytest.raises(ValueError):
        ScheduleSpace(STAGE2, Precision.INT8, TARGETS["h100"], restrict={"STAGES": [5]})


def test_schedule_problems_catch_free_text() -> None:
    sched = ScheduleSpace(STAGE2, Precision.INT8, TARGETS["h100"]).schedule_at(0)
    assert schedule_problems(Precision.INT8, {**sched, "CHUNK": "8; system()"})
    assert schedule_problems(Precision.INT8, {**sched, "EXTRA": 1})
    assert schedule_problems(Precision.INT8, {**sched, "DUP_AWARE": True})
    missing = dict(sched)
    missing.pop("CHUNK")
    assert schedule_problems(Precision.INT8, missing) == [("CHUNK", "missing")]
    assert schedule_hash(sched) == schedule_hash(dict(reversed(list(sched.items()))))
    assert set(knobs_for(Precision.FP32_TC)) - set(knobs_for(Precision.INT8)) == {"SPLIT"}


def test_a_later_knob_at_its_default_keeps_old_schedules_and_hashes() -> None:
    """Schedules stored before MMA existed mean mma.sync: same hash, valid, same build."""
    from kernels.build import BuildJob, cache_key, defines
    from kernels.space import KNOB_DEFAULTS, schedule_hash, schedule_problems

    space = ScheduleSpace(STAGE2, Precision.INT8, TARGETS["h100"])
    new = space.schedule_at(int(space.valid_indices[0]))
    assert new["MMA"] == KNOB_DEFAULTS["MMA"] == "sync"
    # The search reads an unnamed knob as its first value: the same thing, by this.
    from kernels.space import EXTRA_KNOBS

    assert all(EXTRA_KNOBS[k][0] == v for k, v in KNOB_DEFAULTS.items())
    old = {k: v for k, v in new.items() if k != "MMA"}
    assert schedule_hash(old) == schedule_hash(new)
    assert schedule_hash({**new, "MMA": "wgmma"}) != schedule_hash(new)
    assert schedule_problems(Precision.INT8, old) == []
    assert space.index_of(old) == space.index_of(new) and space.is_valid(old)
    d_old, d_new = (defines(BuildJob(STAGE2, Precision.INT8, 90, s)) for s in (old, new))
    assert d_old == d_new and cache_key(d_old, 90) == cache_key(d_new, 90)


@pytest.mark.parametrize("precision", [Precision.INT8, Precision.FP16])
@pytest.mark.parametrize("shape", [
    ConvShape(n=8, h=28, w=28, c=128, k=128, r=3, s=3, stride=(1, 1), pad=(1, 1)),
    ConvShape(n=8, h=56, w=56, c=64, k=64, r=3, s=3, stride=(2, 2), pad=(1, 1)),
    ConvShape(n=2, h=17, w=19, c=24, k=40, r=3, s=3, stride=(1, 1), pad=(2, 2),
              dilation=(2, 2)),
])
def test_field_pixels_is_the_duplicate_aware_channels_outer_footprint(
        shape: ConvShape, precision: Precision) -> None:
    # field_pixels spares the features a second geometry with DUP_AWARE and REORDER_INNER on
    # (NHWCnc, HALO and every tile size among the schedules)
    space = ScheduleSpace(shape, precision, TARGETS["h100"])
    idx = np.random.default_rng(0).choice(space.size, 20000, replace=False)
    cols = space.columns(idx)
    g = geometry(shape, precision, TARGETS["h100"], cols)
    on = np.ones(len(idx), np.int64)
    want = geometry(shape, precision, TARGETS["h100"],
                    {**cols, "DUP_AWARE": on, "REORDER_INNER": on}).footprint_pixels
    assert np.array_equal(field_pixels(shape, cols, g), want)
    assert (np.asarray(cols["LAYOUT"]) == "nhwcnc").any() and (np.asarray(cols["HALO"]) == 1).any()
