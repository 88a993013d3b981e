"""Choosing the measurement backend of this process for a target."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import TYPE_CHECKING

from kernels.spec import Target, get_target, target_for_gpu_model
from workers.backends.base import Backend
from workers.backends.simulated import SimulatedBackend

if TYPE_CHECKING:
    from store.settings import Settings

log = logging.getLogger(__name__)


class NoBackend(RuntimeError):
    """This process cannot measure the target (no such GPU and simulation not allowed)."""


@lru_cache(maxsize=1)
def _gpu_names() -> tuple[str, ...]:
    """The model name of each GPU this process sees, in device order (none without one)."""
    try:
        import cupy  # noqa: F401  (optional extra "gpu")
        from cupy.cuda import runtime

        names = []
        for i in range(runtime.getDeviceCount()):
            name = runtime.getDeviceProperties(i)["name"]
            names.append(name.decode() if isinstance(name, bytes) else str(name))
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU here"
        return ()
    return tuple(names)


@lru_cache(maxsize=1)
def local_gpu_target() -> Target | None:
    """The target of the GPU this process sees (its first), or None without a usable GPU."""
    names = _gpu_names()
    if not names:
        return None
    target = target_for_gpu_model(names[0])
    if target is None:
        log.warning("GPU %r is not a known target; measuring nothing on it", names[0])
    return target


def local_gpus() -> list[int]:
    """Device indices of this process's GPUs of its first GPU's model: the GPUs that
    measure `local_gpu_target()` here (one measuring process each). Others are left out,
    with a warning: a host of mixed models runs a fleet worker per GPU instead."""
    names = _gpu_names()
    if not names or local_gpu_target() is None:
        return []
    same = [i for i, n in enumerate(names) if n == names[0]]
    if len(same) < len(names):
        log.warning("measuring on the %d GPUs of model %r only (%s here)", len(same), names[0],
                    ", ".join(names))
    return same


_backends: dict[str, Backend] = {}


def backend_for(target_name: str, settings: Settings) -> Backend:
    """The backend that measures `target_name` in this process (cached per process).

    auto: the cuda backend for the local GPU's target, the simulated model for others;
    cuda: only the local GPU's target; simulated: the model for every target.
    """
    if target_name in _backends:
        return _backends[target_name]
    target = get_target(target_name)
    local = None if settings.backend == "simulated" else local_gpu_target()
    backend: Backend
    if local is not None and local.name == target.name:
        from workers.backends.cuda import CudaBackend

        backend = CudaBackend(cache_dir=settings.kernel_cache)
    elif settings.backend == "cuda":
        raise NoBackend(f"no GPU of target {target_name} in this process")
    else:
        backend = SimulatedBackend(target, delay_s=settings.sim_delay_s,
                                   crash_rate=settings.sim_crash_rate,
                                   gate_dir=settings.sim_gate_dir)
    _backends[target_name] = backend
    return backend


def builder_backend(target_name: str, settings: Settings) -> Backend:
    """What a CPU builder builds with: NVRTC cubins for real GPUs, or only the validity
    check when the fleet measures with the analytical model."""
    target = get_target(target_name)
    if settings.backend == "simulated":
        return SimulatedBackend(target)
    from workers.backends.cuda import CudaBackend

    return CudaBackend(cache_dir=settings.kernel_cache)


def served_targets(settings: Settings) -> list[str]:
    """Targets this process can measure ('*' for every target, through the model)."""
    if settings.backend == "simulated":
        return ["*"]
    local = local_gpu_target()
    if settings.backend == "cuda":
        return [local.name] if local else []
    return ([local.name] if local else []) + ["*"]
