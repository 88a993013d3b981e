"""`tctune-deploy` (or `python -m deploy`): run a whole model on its tuned kernels.

After `tctune plan MODEL ... --wait` has tuned a model's layers, this looks every conv up in
the service (one bulk lookup), rewrites the model (deploy.optimize), prints the per-layer
plan and, on a GPU, checks the optimized model's output against the float32 model and times
it against PyTorch's fp16 model (channels_last: eager, and torch.compile with inference
freezing), each as one CUDA graph of back-to-back forwards (deploy.measure). With
`--choose-in-model N` each record first takes the fastest of its N runners-up in the service
as the whole model times them (deploy.model_select).
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import click
import httpx


def _gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def run_and_compare(model: Any, fast: Any, x: Any, compile_: bool) -> dict[str, Any]:
    """Agreement with the float32 model on a held-out input, and the latency of the
    optimized model and of PyTorch's fp16 model (eager and compiled), on the GPU."""
    import copy

    import torch

    from deploy.measure import agreement, compile_for_inference, forward_ms
    from kernels.timing import sets_for_l2

    held = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the reference in float32 on the CPU (no TF32)
        want = copy.deepcopy(model).float().cpu()(held)
        got = fast(held.cuda().contiguous(memory_format=torch.channels_last))
    rel, cos = agreement(got, want)
    out: dict[str, Any] = {"rel_err": rel, "cosine": cos}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    x32 = x.cuda().contiguous(memory_format=torch.channels_last)
    inputs = [x32.clone() for _ in range(sets_for_l2(x32.numel() * 4, l2))]
    ours = compile_for_inference(fast, inputs[0]) if compile_ else fast
    out["ours_ms"] = forward_ms(ours, inputs)
    half = copy.deepcopy(model).cuda().half().to(memory_format=torch.channels_last)
    h_inputs = [t.half() for t in inputs]
    out["eager_fp16_ms"] = forward_ms(half, h_inputs)
    if compile_:
        torch._dynamo.reset()
        out["compiled_fp16_ms"] = forward_ms(compile_for_inference(half, h_inputs[0]), h_inputs)
    return out


def choose_in_model(fast: Any, client: Any, x: Any, runners_up: int,
                    compile_: bool) -> dict[str, Any]:
    """Each record's schedule chosen among its best and runners-up by timing the model on the
    GPU as it will run (compiled or not: deploy.measure.model_ruler; deploy.model_select),
    with a progress bar on stderr; what changed."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from deploy import model_select
    from deploy.measure import model_ruler

    candidates = model_select.candidates_from_service(client, fast, runners_up)
    inputs = [x.clone() for _ in range(2)]
    forward_us = model_ruler(fast, inputs, compile_)
    with Progress(TextColumn("[bold]schedules in the model"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        tid = bar.add_task("choose", total=len(model_select.layer_groups(fast)))
        choices = model_select.choose_in_model(fast, candidates, forward_us,
                                               progress=lambda _: bar.advance(tid))
    return {"records": len(choices), "schedules_tried": sum(len(c.tried) for c in choices),
            "changed": [{"key": c.key, "layers": c.layers, "schedule": c.schedule}
                        for c in choices if c.changed]}


@click.command()
@click.argument("model")
@click.option("--input-shape", required=True, metavar="N,C,H,W",
              help="the input the kernels are built and the int8 scales calibrated for")
@click.option("--precision", required=True, type=click.Choice(["fp16", "int8"]))
@click.option("--target", default=None, help="h100, h200, a100, ... [default: the GPU at hand]")
@click.option("--server", default=None, envvar="TCTUNE_SERVER",
              help="the tctune service holding the schedules [default: http://127.0.0.1:8000]")
@click.option("--token", default=None, envvar="TCTUNE_TOKEN", help="API token (read scope)")
@click.option("--compile/--no-compile", "compile_", default=True, show_default=True,
              help="run the optimized model and PyTorch's under torch.compile as well")
@click.option("--report-only", is_flag=True,
              help="print the per-layer plan without running anything (no GPU needed)")
@click.option("--choose-in-model", "runners_up", default=0, show_default=True,
              type=click.IntRange(min=0), metavar="N",
              help="time the whole model with each layer's next N fastest schedules in the "
                   "service and keep the fastest (GPU; the model compiled, as --compile runs it)")
def main(model: str, input_shape: str, precision: str, target: str | None, server: str | None,
         token: str | None, compile_: bool, report_only: bool, runners_up: int) -> None:
    """Run MODEL (torchvision:NAME or module.path:factory, random weights) on the tuned
    kernels of the service's schedules: the per-layer plan goes to stderr, a JSON summary
    to stdout (layers replaced and tuned, and on a GPU the agreement with the float32 model
    and the latencies)."""
    import torch

    from api.client import DEFAULT_SERVER, Client, TctuneError
    from api.plan import build_module, parse_input_shape
    from deploy.optimize import optimize
    from kernels.runtime import DefaultScheduleWarning

    gpu = _gpu()
    if runners_up and report_only:
        raise click.ClickException("--choose-in-model times the model on the GPU: it does not "
                                   "go with --report-only")
    if not report_only and not gpu:
        raise click.ClickException("running the kernels needs a CUDA GPU (and CuPy); "
                                   "--report-only prints the plan without one")
    if not gpu and target is None:
        raise click.ClickException("--target is needed without a GPU (e.g. --target h100)")
    try:
        shape = parse_input_shape(input_shape)
        module = build_module(model).eval()
    except ValueError as err:
        raise click.ClickException(f"{model}: {err}") from None
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    if gpu:
        module, x = module.cuda(), x.cuda().contiguous(memory_format=torch.channels_last)
    url = server or DEFAULT_SERVER
    client = Client(url, token=token)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DefaultScheduleWarning)  # the plan says which
            fast = optimize(module, x, precision, target, client,
                            backend="cuda" if gpu else "reference")
        chosen = choose_in_model(fast, client, x, runners_up, compile_) if runners_up else None
    except TctuneError as err:
        raise click.ClickException(f"the service at {url}: {err}") from None
    except httpx.HTTPError as err:
        raise click.ClickException(f"cannot reach the service at {url}: {err}") from None
    except (ValueError, RuntimeError) as err:
        first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
        raise click.ClickException(f"{model}: {first}") from None
    click.echo(fast.report(), err=True)
    plan = fast.plan
    out: dict[str, Any] = {
        "model": model, "precision": precision, "target": fast.target.name,
        "convs": len(plan), "replaced": sum(lp.replaced for lp in plan),
        "tuned": sum(lp.replaced and not lp.default_schedule for lp in plan)}
    if chosen is not None:
        out["chosen_in_model"] = chosen
    if not report_only:
        out.update(run_and_compare(module, fast, x, compile_))
        for k in ("eager_fp16_ms", "compiled_fp16_ms"):
            if k in out:
                out[f"vs_{k[:-3]}"] = round(out[k] / out["ours_ms"], 3)
    click.echo(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
