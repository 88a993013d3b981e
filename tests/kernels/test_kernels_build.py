"""NVRTC builds of the conv kernel on a CPU: validity and the compiler agree, SASS holds the
intended Tensor Core instructions and no spills, failures are data."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kernels.build import BuildJob, Epilogue, build, build_many, cubin_path
from kernels.launch import launch, supports_pdl
from kernels.sass import cuobjdump_path, summarize
from kernels.space import ScheduleSpace, geometry, validity
from kernels.spec import RESNET50_3X3, ConvShape, Precision, get_target
from tests.conftest import SASS_MISSING
from tests.kernels.builds import assert_all_compile

SM_TARGET = {75: "t4", 80: "a100", 90: "h100"}
SAMPLES = int(os.environ.get("TCTUNE_BUILD_SAMPLES", "200"))
SHAPES = [
    RESNET50_3X3["stage2"], RESNET50_3X3["stage3"], RESNET50_3X3["stage4"],
    RESNET50_3X3["stage5"],
    ConvShape(2, 32, 32, 3, 64, 7, 7, stride=2, pad=3),
    ConvShape(8, 14, 14, 64, 96, 1, 1),
    ConvShape(3, 13, 11, 48, 40, 3, 3, stride=2, pad=1),
    ConvShape(2, 17, 19, 24, 40, 3, 3, pad=2, dilation=2),
]
BASE = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=2, WARP_ROW_TILES=2, WARP_COL_TILES=4, CHUNK=2,
            REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=2, SPLIT_K=1)

# Fails (does not skip) without cuobjdump: .ci/run installs it with the dev extra.
needs_sass = pytest.mark.usefixtures("sass_tools")


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cubins")


def sample_jobs(precision: Precision, sm: int, count: int, seed: int) -> list[BuildJob]:
    rng = np.random.default_rng(seed)
    target = get_target(SM_TARGET[sm])
    jobs = []
    spaces = [ScheduleSpace(shape, precision, target) for shape in SHAPES]  # one enumeration each
    for i in range(count):
        shape, space = SHAPES[i % len(SHAPES)], spaces[i % len(SHAPES)]
        sched = space.schedule_at(int(rng.choice(space.valid_indices)))
        epi = Epilogue(str(rng.choice(["acc", "default"])), bool(rng.random() < 0.3))
        if epi.mode == "acc" and sched.get("PACK_OUT") == 2:  # TMA stores: 8/16-bit outputs
            epi = Epilogue("default", epi.relu)
        jobs.append(BuildJob(shape, precision, sm, sched, epi))
    return jobs


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 600 NVRTC builds on the 2-core CI machine
@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
def test_sampled_valid_schedules_compile_for_every_sm(precision: str, cache: Path) -> None:
    jobs = [j for sm in (75, 80, 90)
            for j in sample_jobs(Precision(precision), sm, SAMPLES, seed=sm)]
    assert_all_compile(jobs, cache)


def test_compile_failure_is_data(cache: Path) -> None:
    res = build(BuildJob(RESNET50_3X3["stage3"], Precision.INT8, 90,
                         {**BASE, "CHUNK": 3}), cache)
    assert res.status == "compile_error" and "CHUNK" in res.log
    # A schedule the kernel cannot express on the architecture: the compiler's static
    # assertion comes back as the log, not as an exception.
    res = build(BuildJob(RESNET50_3X3["stage3"], Precision.FP32_TC, 75,
                         {**BASE, "STAGES": 3, "SPLIT": "scaled3"}), cache)
    assert res.status == "compile_error" and "double-buffered" in res.log


def test_cache_hit_and_key_depends_on_sm(cache: Path) -> None:
    job = BuildJob(RESNET50_3X3["stage4"], Precision.FP16, 80, BASE)
    first, second = build(job, cache), build(job, cache)
    assert first.status == "ok" and second.cached and second.key == first.key
    other = build(BuildJob(RESNET50_3X3["stage4"], Precision.FP16, 90, BASE), cache)
    assert other.key != first.key and cubin_path(cache, other.key).exists()


# ---- each rule of validity exists because something fails without it ------------------
def _only_rule_broken(shape: ConvShape, precision: Precision, target_name: str, rule: str,
                      limit: int = 40) -> list[dict]:
    """Schedules of the space that break `rule` and no other rule."""
    target = get_target(target_name)
    space = ScheduleSpace(shape, precision, target, restrict={
        "MMA": ["sync"], "TMA": [0], "FOLD_TAPS": [0], "PERSIST": [0], "PLAIN_A": [0],
        "PINGPONG": [0], "HALO": [0], "SWAP_AB": [0], "SPLIT_CLUSTER": [0]})
    idx = np.arange(space.size)
    cols = space.columns(idx)
    g = geometry(shape, precision, target, cols)
    cap = np.minimum(255, (65536 // g.threads) // 8 * 8)
    deep = np.where(cols["CHUNK"] >= 4, 16, 0)
    regs_ok = g.acc_regs + 2 * g.frag_regs + 64 + deep <= cap
    smem_ok = g.smem_bytes <= target.smem_per_block_kib * 1024
    valid = validity(shape, precision, target, cols)
    pick = {"regs": ~regs_ok & smem_ok, "smem": regs_ok & ~smem_ok}[rule]
    # everything else fine: making the broken quantity fit would make it valid
    out = [space.schedule_at(int(i)) for i in idx[pick & ~valid]]
    rng = np.random.default_rng(0)
    return [out[int(i)] for i in rng.permutation(len(out))[:limit]]


def test_register_rule_guards_spills(cache: Path) -> None:
    shape = RESNET50_3X3["stage3"]
    scheds = _only_rule_broken(shape, Precision.INT8, "h100", "regs", limit=40)
    assert scheds
    results = build_many([BuildJob(shape, Precision.INT8, 90, s) for s in scheds], cache)
    spilled = [r for r in results if r.status == "compile_error" and "spill" in r.log]
    assert spilled, "no schedule past the register rule spilled: the rule would be unneeded"


def test_shared_memory_rule_guards_the_launch_limit(cache: Path) -> None:
    shape = RESNET50_3X3["stage2"]
    target = get_target("h100")
    scheds = _only_rule_broken(shape, Precision.FP16, "h100", "smem", limit=3)
    assert scheds
    for s in scheds:
        res = build(BuildJob(shape, Precision.FP16, 90, s), cache)
        # It compiles (the kernel static_asserts geometry() == what it allocates), but asks
        # for more dynamic shared memory than any block may launch with.
        assert res.status == "ok"
        assert res.meta["smem_bytes"] > target.smem_per_block_kib * 1024


def test_stages_rule_on_register_staged_paths(cache: Path) -> None:
    shape = RESNET50_3X3["stage3"]
    for prec, sm in ((Precision.INT8, 75), (Precision.INT4, 90)):
        res = build(BuildJob(shape, prec, sm, {**BASE, "STAGES": 3}), cache)
        assert res.status == "compile_error" and "double-buffered" in res.log
        assert not ScheduleSpace(shape, prec, get_target(SM_TARGET[sm])).is_valid(
            {**BASE, "STAGES": 3})


# ---- the wgmma path (MMA=wgmma, sm_90a) --------------------------------------------------
WG = {**BASE, "BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 1, "WARP_ROW_TILES": 1, "WARP_COL_TILES": 2,
      "CHUNK": 4, "STAGES": 6, "MMA": "wgmma"}


@pytest.mark.parametrize("precision,sm,extra,why", [
    ("int8", 80, {}, "sm_90a"),  # the instruction exists on sm_90a only
    ("int8", 90, {"DUP_AWARE": 1, "REORDER_INNER": 1}, "whole swizzled tiles"),
    ("int4", 90, {"STAGES": 2}, "fp16 or int8"),  # int4 reaches sm_90 through the s8 loader
    ("fp16", 90, {"BLK_ROW_WARPS": 4, "BLK_COL_WARPS": 4}, "8 warpgroups"),
])
def test_wgmma_rules(precision: str, sm: int, extra: dict, why: str, cache: Path) -> None:
    shape, s = RESNET50_3X3["stage3"], {**WG, **extra}
    res = build(BuildJob(shape, Precision(precision), sm, s), cache)
    assert res.status == "compile_error" and why in res.log, res.log[-500:]
    assert not ScheduleSpace(shape, Precision(precision), get_target(SM_TARGET[sm])).is_valid(s)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_wgmma_wide_stage_rows_are_two_swizzle_atoms(precision: str, cache: Path) -> None:
    """CHUNK 8 makes 256-byte stage rows, wider than wgmma's widest swizzle: they are stored
    as two 128-byte atoms per 8-row group and build (the GPU check runs them)."""
    shape, s = RESNET50_3X3["stage4"], {**WG, "CHUNK": 8, "STAGES": 4}
    assert ScheduleSpace(shape, Precision(precision), get_target("h100")).is_valid(s)
    res = build(BuildJob(shape, Precision(precision), 90, s), cache)
    assert res.status == "ok", res.log[-500:]
    assert cuobjdump_path(), SASS_MISSING
    assert any("GMMA" in m for m in summarize(cubin_path(cache, res.key)).mma)


def test_wgmma_1024_thread_margin_guards_a_spill(cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """REG_WGMMA_1024: without it this 8-warpgroup schedule is valid, and it fills the
    64-register cap of a 1024-thread block (or spills: 4 bytes did with an earlier epilogue),
    so any code it gains spills."""
    shape = ConvShape(n=8, h=7, w=6, c=64, k=40, r=3, s=3, stride=(1, 1), pad=(0, 0),
                      dilation=(1, 1))
    s = {**WG, "BLK_ROW_WARPS": 2, "BLK_COL_WARPS": 4, "WARP_ROW_TILES": 2,
         "WARP_COL_TILES": 1, "CHUNK": 2, "REORDER_INNER": 0, "STAGES": 2, "SPLIT_K": 4}
    res = build(BuildJob(shape, Precision.INT8, 90, s), cache)
    if res.status == "ok":
        assert cuobjdump_path(), SASS_MISSING
        assert summarize(cubin_path(cache, res.key)).registers == 65536 // 1024
    else:
        assert res.status == "compile_error" and "spill" in res.log, res.log[-300:]
    assert not ScheduleSpace(shape, Precision.INT8, get_target("h100")).is_valid(s)
    monkeypatch.setattr("kernels.space.REG_WGMMA_1024", 0)
    assert ScheduleSpace(shape, Precision.INT8, get_target("h100")).is_valid(s)


def test_wgmma_register_rule_guards_spills(cache: Path) -> None:
    shape, target = RESNET50_3X3["stage2"], get_target("h100")
    space = ScheduleSpace(shape, Precision.INT8, target, restrict={"MMA": ["wgmma"],
                                                                   "PACK_OUT": [1], "TMA": [0],
                                                                   "HALO": [0],
                                                                   "SWAP_AB": [0],
                                                                   "SPLIT_CLUSTER": [0]})
    idx = np.arange(space.size)
    cols = space.columns(idx)
    g = geometry(shape, Precision.INT8, target, cols)
    cap = np.minimum(255, (65536 // g.threads) // 8 * 8)
    others_ok = (g.smem_bytes <= target.smem_per_block_kib * 1024) & (g.threads <= 1024) & \
        (cols["DUP_AWARE"] == 0)
    # past the rule by a few registers only, everything else fine
    near = others_ok & (g.acc_regs + 16 > cap - 24) & (g.acc_regs <= cap) & \
        ~validity(shape, Precision.INT8, target, cols)
    pick = np.random.default_rng(0).permutation(idx[near])[:30]
    assert len(pick)
    results = build_many([BuildJob(shape, Precision.INT8, 90, space.schedule_at(int(i)))
                          for i in pick], cache)
    spilled = [r for r in results if r.status == "compile_error" and "spill" in r.log]
    assert spilled, "no schedule past the wgmma register rule spilled: the rule would be unneeded"


def test_tma_register_rule_admits_four_warpgroups_of_64_accumulators(cache: Path) -> None:
    """TMA builds' math threads load nothing: a 256 x 128 tile over 4 warpgroups behind the
    producer warp (64 accumulators a thread, 120 registers) is valid and compiles without
    spilling in the precisions and epilogues it runs with; with split-K or one stage it is
    left out (both spilled), and the loader's model still rejects its cp.async twin."""
    shape, target = ConvShape(8, 128, 128, 128, 128, 3, 3, pad=1), get_target("h100")
    s = {**BASE, "BLK_ROW_WARPS": 4, "BLK_COL_WARPS": 1, "WARP_ROW_TILES": 1,
         "WARP_COL_TILES": 4, "CHUNK": 4, "STAGES": 4, "MMA": "wgmma", "TMA": 2}
    for p in (Precision.FP16, Precision.INT8):
        space = ScheduleSpace(shape, p, target)
        assert space.is_valid(s)
        for breaks in ({"SPLIT_K": 2}, {"STAGES": 1}, {"TMA": 0}):
            assert not space.is_valid({**s, **breaks})
    one_stage = {**s, "STAGES": 1, "PERSIST": 1}
    results = build_many([BuildJob(shape, Precision.FP16, 90, s, Epilogue("bias", True, True)),
                          BuildJob(shape, Precision.INT8, 90, s, Epilogue("acc", False, False)),
                          BuildJob(shape, Precision.INT8, 90, one_stage)], cache)
    assert all(r.status == "ok" for r in results[:2]), [r.log[-400:] for r in results]
    # the one-stage loop's held registers: why it is left out
    assert results[2].status == "compile_error" and "spill" in results[2].log


def test_int8_swapped_tile_with_tma_stores_compiles_on_64_channels(cache: Path) -> None:
    """A swapped int8 ping-pong tile with TMA stores over 2 x 2 row tiles, on a layer of
    exactly 64 output channels (one column tile) and on 128: in the space, and both compile
    without spills. Staged value by value, each store with an address of its own, the
    64-channel build spilled (docs/kernels/register-rule.md, "Code shape")."""
    target = get_target("h100")
    k64, k128 = (ConvShape(8, 56, 56, 64, k, 3, 3, pad=1) for k in (64, 128))
    s = {**BASE, "BLK_ROW_WARPS": 2, "BLK_COL_WARPS": 1, "WARP_ROW_TILES": 2,
         "WARP_COL_TILES": 2, "CHUNK": 2, "STAGES": 4, "MMA": "wgmma", "TMA": 2, "PERSIST": 1,
         "PINGPONG": 1, "SWAP_AB": 1, "PACK_OUT": 2}
    assert all(ScheduleSpace(sh, Precision.INT8, target).is_valid(s) for sh in (k64, k128))
    results = build_many([BuildJob(sh, Precision.INT8, 90, s) for sh in (k64, k128)], cache)
    assert all(r.status == "ok" for r in results), [r.log[-400:] for r in results]


def test_deep_pipelines_are_pruned_from_mma_sync_not_impossible(cache: Path) -> None:
    """STAGES 4-8 with mma.sync compile and run; the space leaves them out because they were
    measured no better there (docs/decisions.md), not because they fail."""
    s = {**BASE, "STAGES": 4}
    assert build(BuildJob(RESNET50_3X3["stage3"], Precision.INT8, 90, s), cache).status == "ok"
    assert not ScheduleSpace(RESNET50_3X3["stage3"], Precision.INT8, get_target("h100")
                             ).is_valid(s)
    assert ScheduleSpace(RESNET50_3X3["stage3"], Precision.INT8, get_target("h100")
                         ).is_valid({**WG, "STAGES": 8})


# ---- TMA loads (TMA=1, wgmma only) -------------------------------------------------------
@pytest.mark.parametrize("extra,why", [
    ({"MMA": "sync", "STAGES": 2}, "whole NHWC im2col"),  # the loads feed wgmma's tiles
    ({"LAYOUT": "nhwcnc", "STAGES": 2}, "whole NHWC im2col"),
    # 2 warpgroups x 256 columns: the weight box would have 512 rows
    ({"BLK_COL_WARPS": 2, "WARP_COL_TILES": 8, "STAGES": 2, "PACK_OUT": 0}, "256 rows"),
])
def test_tma_rules(extra: dict, why: str, cache: Path) -> None:
    shape, s = RESNET50_3X3["stage3"], {**WG, "TMA": 1, **extra}
    res = build(BuildJob(shape, Precision.FP16, 90, s), cache)
    assert res.status == "compile_error" and why in res.log, res.log[-500:]
    space = ScheduleSpace(shape, Precision.FP16, get_target("h100"))
    assert not space.is_valid(s)
    assert space.is_valid({**s, "TMA": 0}) or extra.get("MMA") == "sync"


def test_tma_walk_limits_hold_for_every_valid_shape() -> None:
    """The im2col walk's limits that validity does not test, because the shape limits and
    the register rule imply them (conv.cu static_asserts them)."""
    from kernels import spec

    span = (spec.MAX_FILTER - 1) * spec.MAX_DILATION
    assert spec.MAX_STRIDE <= 8 and spec.MAX_FILTER <= 127 and span - 0 <= 128
    for prec in (Precision.FP16, Precision.INT8):
        space = ScheduleSpace(RESNET50_3X3["stage2"], prec, get_target("h100"),
                              restrict={"TMA": [1]})
        assert space.geometry(space.valid_indices).block_m.max() <= 1024


@pytest.mark.parametrize("precision,chunk,boxes", [("int8", 4, 1), ("int8", 8, 2),
                                                   ("fp16", 2, 1), ("fp16", 8, 2)])
def test_tma_builds_load_with_tma(precision: str, chunk: int, boxes: int, cache: Path) -> None:
    """A TMA build's stages are bulk tensor copies (UTMALDG; a 256-byte stage row is two
    128-byte boxes per operand), no cp.async, and the wgmma instructions read them."""
    s = {**WG, "CHUNK": chunk, "STAGES": 4, "TMA": 1}
    shape = RESNET50_3X3["stage4"]
    assert ScheduleSpace(shape, Precision(precision), get_target("h100")).is_valid(s)
    res = build(BuildJob(shape, Precision(precision), 90, s), cache)
    assert res.status == "ok", res.log[-500:]
    assert cuobjdump_path(), SASS_MISSING
    summary = summarize(cubin_path(cache, res.key))
    assert any("GMMA" in m for m in summary.mma) and not summary.spills
    lines = summary.text.splitlines()
    assert not any("LDGSTS" in line for line in lines)
    # two copies (A and B) per box in the prologue, or the weights' before the wait for the
    # kernel before and the activations' after it (W_EARLY), and two in the refill
    assert sum("UTMALDG" in line for line in lines) == 6 * boxes


def test_tma_maps_describe_the_im2col_walk() -> None:
    """launch_meta's TMA parameters: NHWC as (C, W, H, N) walked over exactly the P x Q output
    positions (lower corner -pad, upper corner pad - (filter - 1) * dilation, traversal
    stride = conv stride), KRSC weights as (C, R*S, K), boxes of one swizzle atom."""
    from kernels.build import defines, launch_meta

    shape = ConvShape(2, 17, 19, 24, 40, 3, 5, stride=(2, 1), pad=(1, 2), dilation=(1, 2))
    s = {**WG, "CHUNK": 2, "STAGES": 4, "TMA": 1}
    job = BuildJob(shape, Precision.FP16, 90, s)
    tma = launch_meta(job, defines(job))["tma"]
    cp = 24
    assert tma["dtype"] == "float16" and tma["swizzle_bytes"] == 64  # 2 k-steps of 32 bytes
    x = tma["x"]
    assert x["dims"] == [cp, 19, 17, 2] and x["strides"] == [cp * 2, 19 * cp * 2, 17 * 19 * cp * 2]
    assert x["lower"] == [-2, -1] and x["upper"] == [2 - 4 * 2, 1 - 2]
    assert x["element_strides"] == [1, 1, 2, 1]
    assert x["channels"] == 32 and x["pixels"] == 64
    # the walk covers exactly Q x P positions per image, as the conv's output has
    for dim, lo, hi, st, out in ((19, -2, -6, 1, shape.q), (17, -1, -1, 2, shape.p)):
        assert (dim + hi - lo - 1) // st + 1 == out
    w = tma["w"]
    assert w["dims"] == [cp, 15, 40] and w["strides"] == [cp * 2, 15 * cp * 2]
    assert w["box"] == [32, 1, 64]
    assert launch_meta(BuildJob(shape, Precision.FP16, 90, {**s, "TMA": 0}),
                       defines(BuildJob(shape, Precision.FP16, 90, {**s, "TMA": 0})))["tma"] is None


def test_wgmma_header_is_generated_from_its_script() -> None:
    from kernels import gen_wgmma

    assert gen_wgmma.OUT.read_text() == gen_wgmma.render(), "run python -m kernels.gen_wgmma"


def test_nhwcnc_rule(cache: Path) -> None:
    shape = ConvShape(3, 14, 14, 64, 64, 3, 3, pad=1)  # batch 3: no 8-image blocks
    s = {**BASE, "LAYOUT": "nhwcnc"}
    res = build(BuildJob(shape, Precision.INT8, 90, s), cache)
    assert res.status == "compile_error" and "NHWCnc" in res.log
    assert not ScheduleSpace(shape, Precision.INT8, get_target("h100")).is_valid(s)


# ---- what the cubins hold ------------------------------------------------------------
@needs_sass
@pytest.mark.parametrize("precision,sm,want", [
    ("int4", 75, "IMMA.8832.S4.S4"), ("int4", 80, "IMMA.16864.S4.S4"),
    ("int8", 90, "IMMA.16832.S8.S8"), ("int8", 75, "IMMA.8816.S8.S8"),
    ("fp16", 75, "HMMA.1688.F32"), ("fp16", 80, "HMMA.16816.F32"), ("fp16", 90, "HMMA.16816.F32"),
    ("int8", 90, "IGMMA.64x64x32.S8.S8"), ("fp16", 90, "HGMMA.64x64x16.F32"),
])
def test_sass_has_tensor_core_instructions_and_no_spills(precision: str, sm: int, want: str,
                                                         cache: Path) -> None:
    variants: tuple[dict, ...] = ({}, {"DUP_AWARE": 1, "REORDER_INNER": 1},
                                  {"PACK_OUT": 0, "SPLIT_K": 2})
    if "GMMA" in want:  # the warpgroup path: no duplicate-aware loads
        variants = ({}, {"PACK_OUT": 0, "SPLIT_K": 2}, {"LAYOUT": "nhwcnc", "STAGES": 2})
    for extra in variants:
        s = {**(WG if "GMMA" in want else BASE), **extra}
        res = build(BuildJob(RESNET50_3X3["stage3"], Precision(precision), sm, s), cache)
        assert res.status == "ok", res.log
        summary = summarize(cubin_path(cache, res.key))
        assert want in summary.mma, summary.mma
        assert not summary.spills and summary.stack == 0


def test_kernels_import_without_cupy() -> None:
    import importlib

    for mod in ("kernels.build", "kernels.runner", "kernels.reference", "kernels.timing",
                "kernels.cudnn", "workers.backends.cuda"):
        importlib.import_module(mod)


@needs_sass
def test_sm90_builds_wait_for_their_predecessor_and_older_ones_have_no_such_wait(
        cache: Path) -> None:
    """Programmatic dependent launch (kernels/launch.py, pdl): every sm_90 build waits for the
    kernel before it (ACQBULK) and lets its dependents be scheduled (PREEXIT) in its prologue,
    so any of them may be launched with the attribute; sm_75 / sm_80 builds have neither."""
    for sm, s in ((90, WG), (90, BASE), (80, BASE), (75, {**BASE, "STAGES": 2})):
        res = build(BuildJob(RESNET50_3X3["stage3"], Precision.INT8, sm, s), cache)
        assert res.status == "ok", res.log
        text = summarize(cubin_path(cache, res.key)).text
        assert ("ACQBULK" in text and "PREEXIT" in text) == (sm >= 90), (sm, s)
        assert supports_pdl(res.meta["sm"]) == (sm >= 90)
    meta = build(BuildJob(RESNET50_3X3["stage3"], Precision.INT8, 80, BASE), cache).meta
    with pytest.raises(ValueError, match="needs an sm_90 build"):
        launch(None, meta, *[None] * 7, pdl=True)
    with pytest.raises(ValueError, match="w_ready says"):
        launch(None, meta, *[None] * 7, w_ready=True)


# ResNet-50's stem with folded taps (FOLD_TAPS)
STEM = ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3)
STEM_FOLD = {**WG, "FOLD_TAPS": 1}


@needs_sass
@pytest.mark.parametrize("schedule,early", [
    (WG, True), ({**WG, "TMA": 1}, True), ({**WG, "TMA": 2}, True), (BASE, True),
    ({**WG, "PERSIST": 1}, True), ({**WG, "TMA": 2, "PERSIST": 1}, True),
    ({**WG, "TMA": 2, "PERSIST": 1, "PINGPONG": 1}, True), (STEM_FOLD, True),
    ({**WG, "SPLIT_K": 2}, False), ({**BASE, "STAGES": 1}, False)])
def test_sm90_builds_copy_their_first_weights_before_the_wait(
        cache: Path, schedule: dict, early: bool) -> None:
    """W_EARLY (pipeline.cuh): where the launch says the weights are ready, the first stages'
    weight copies (cp.async or bulk tensor copies) come before a wait for the kernel before
    (ACQBULK); without the flag the wait comes first (the code holds both orders). Persistent
    grids too (their first tile's), and folded taps; not with split-K or one stage."""
    shape = STEM if schedule is STEM_FOLD else RESNET50_3X3["stage3"]
    res = build(BuildJob(shape, Precision.INT8, 90, schedule), cache)
    assert res.status == "ok", res.log
    lines = summarize(cubin_path(cache, res.key)).text.splitlines()
    copies = [i for i, ln in enumerate(lines) if " LDGSTS" in ln or " UTMALDG" in ln]
    waits = [i for i, ln in enumerate(lines) if " ACQBULK" in ln]
    assert copies and waits
    assert (copies[0] < waits[-1]) == early, (copies[0], waits)
