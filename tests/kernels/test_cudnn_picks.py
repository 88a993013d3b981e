"""kernels/cudnn.py's algorithm picks (CPU: only cuDNN's flags are involved): the heuristic's
pick, then cudnn.benchmark's under a cache key of its own for 16-bit inputs, the faster
counting, and the caller's flags put back."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels.cudnn import ALGORITHM_PICKS, fastest_pick  # noqa: E402


@pytest.mark.parametrize(("half", "tf32", "want"), [
    (True, False, [(False, False), (True, True)]),  # fp16: benchmark's pass flips the key
    (False, False, [(False, False), (True, False)]),  # fp32: the math's flag is kept
    (False, True, [(False, True), (True, True)]),
])
def test_each_pick_runs_with_its_flags_and_the_faster_counts(half: bool, tf32: bool,
                                                             want: list) -> None:
    cudnn = torch.backends.cudnn
    before = cudnn.benchmark, cudnn.allow_tf32
    seen = []
    times = iter([5.0, 3.0])

    def timed() -> float:
        seen.append((cudnn.benchmark, cudnn.allow_tf32))
        return next(times)

    assert fastest_pick(timed, float, half=half, tf32=tf32) == 3.0
    assert seen == want
    assert (cudnn.benchmark, cudnn.allow_tf32) == before
    assert len(ALGORITHM_PICKS) == 2


def test_flags_are_put_back_when_a_timing_fails() -> None:
    cudnn = torch.backends.cudnn
    before = cudnn.benchmark, cudnn.allow_tf32

    def boom() -> float:
        raise RuntimeError("no algorithm")

    with pytest.raises(RuntimeError):
        fastest_pick(boom, float, half=True)
    assert (cudnn.benchmark, cudnn.allow_tf32) == before
