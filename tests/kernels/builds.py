"""What the kernel tests check of builds: every job of a sample compiles, and one build's
SASS holds the instructions its schedule is meant to produce; and which builds of a small
kernel (kernels/small_kernel.py) a GPU test runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kernels.build import BuildJob, build, build_many, cubin_path
from kernels.sass import SassSummary, summarize


def assert_all_compile(jobs: Sequence[BuildJob], cache: Path) -> None:
    results = build_many(jobs, cache)
    bad = [(j.sm, j.shape.key(), j.schedule, r.log[-400:])
           for j, r in zip(jobs, results, strict=True) if r.status != "ok"]
    assert not bad, f"{len(bad)} valid schedules failed to compile, e.g. {bad[:3]}"


def sass_of(job: BuildJob, cache: Path) -> SassSummary:
    """The SASS of `job`, which must compile (needs the `sass_tools` fixture's tools)."""
    res = build(job, cache)
    assert res.status == "ok", res.log[-500:]
    return summarize(cubin_path(cache, res.key))


def assert_mma_and_copy(summary: SassSummary, mma: str, copy: str) -> None:
    """The build's matrix instruction (HMMA, IMMA, GMMA), no spill, and its global->shared
    copy (LDG, LDGSTS, UTMALDG...)."""
    assert any(mma in m for m in summary.mma) and not summary.spills
    assert any(copy in line for line in summary.text.splitlines())


def small_kernel_builds() -> list[tuple[int, bool, bool]]:
    """(sm, pdl, ptx) of the builds a small kernel's GPU test runs on this GPU: its own sm's,
    with and without PDL where it has it, and the older targets' (the T4's and A100's) as
    PTX, which the driver compiles for this GPU."""
    import torch

    from kernels.launch import supports_pdl

    major, _ = torch.cuda.get_device_capability()
    sm = 90 if major >= 9 else 80 if major >= 8 else 75
    return [(sm, False, False)] + [(sm, True, False)] * supports_pdl(sm) + \
        [(t, False, True) for t in (75, 80) if t < sm]
