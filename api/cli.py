"""The `tctune` command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from api.cli_errors import OneLineErrors, explain
from kernels.spec import ConvShape


def _parse_shape(text: str) -> ConvShape:
    """'n=8,h=56,w=56,c=64,k=64,r=3,s=3,pad=1' (pairs as 1x2; concat=N for two inputs;
    residual=1 for a residual added in the epilogue; b2b=N for a back-to-back 1x1 conv of N
    output channels over the output)."""
    fields: dict[str, Any] = {}
    for part in text.split(","):
        if "=" not in part:
            raise click.BadParameter(f"expected name=value, got {part!r}", param_hint="--shape")
        name, value = (x.strip() for x in part.split("=", 1))
        try:
            nums = [int(v) for v in value.lower().split("x")]
        except ValueError:
            raise click.BadParameter(f"{name}: {value!r} is not an integer",
                                     param_hint="--shape") from None
        if name in ("stride", "pad", "dilation"):
            fields[name] = (nums[0], nums[-1])
        elif name in ("n", "h", "w", "c", "k", "r", "s", "concat", "b2b") and len(nums) == 1:
            fields[name] = nums[0]
        elif name == "residual" and len(nums) == 1 and nums[0] in (0, 1):
            fields[name] = bool(nums[0])
        else:
            raise click.BadParameter(f"unknown or malformed field {name!r}", param_hint="--shape")
    missing = [f for f in ("n", "h", "w", "c", "k", "r", "s") if f not in fields]
    if missing:
        raise click.BadParameter(f"missing {', '.join(missing)}", param_hint="--shape")
    return ConvShape(**fields)


@click.group(cls=OneLineErrors)
def main() -> None:
    """tctune: autotuning of reduced-precision convolution on NVIDIA Tensor Cores."""


# --- the service ------------------------------------------------------------------------

@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--data", default=None, type=click.Path(file_okay=False),
              help="data directory of the embedded default [env TCTUNE_DATA_DIR]")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="API processes; with more than one, the embedded dispatcher runs in this "
                   "parent process")
def serve(host: str, port: int, data: str | None, workers: int) -> None:
    """Run the API (and, with no broker configured, the embedded dispatcher)."""
    import logging

    import uvicorn

    if data:
        os.environ["TCTUNE_DATA_DIR"] = data
    from api.app import create_app
    from store import migrate
    from store.settings import Settings

    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = settings.db_url
    if url.startswith("sqlite"):
        migrate.upgrade(url)  # the embedded default keeps its own schema current
    elif migrate.current_revision(url) != migrate.head_revision(url):
        raise click.ClickException("the database schema is not current: run `tctune db upgrade`")
    if settings.embedded and settings.auth == "required":
        _first_token(settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    mode = "embedded" if settings.embedded else f"distributed (broker {settings.broker_url})"
    click.echo(f"tctune: {mode}, database {url.split('@')[-1]}", err=True)
    _how_to_reach(settings, host, port)
    if workers == 1:
        uvicorn.run(_frozen(create_app(settings)), host=host, port=port, log_level="warning")
        return
    # Several processes share the port (GET /schedule is CPU-bound Python); each serves the
    # API only, and the one dispatcher lives here so that no job is dispatched twice.
    runner = None
    if settings.embedded:
        from workers.embedded import EmbeddedDispatcher

        runner = EmbeddedDispatcher(settings)
        runner.start()
    try:
        uvicorn.run("api.cli:api_only_app", factory=True, host=host, port=port,
                    workers=workers, log_level="warning")
    finally:
        if runner is not None:
            runner.stop()


def _how_to_reach(settings: Any, host: str, port: int) -> None:
    """Where the service listens, and how to point the CLI (of this or another shell) at it."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    base = f"http://{shown}:{port}"
    click.echo(f"tctune: listening on {base} (dashboard {base}/, API docs {base}/docs)",
               err=True)
    point = "" if base == "http://127.0.0.1:8000" else f"TCTUNE_SERVER={base} "
    token_file = (settings.data_dir / "token").resolve()
    if settings.auth == "required" and token_file.is_file():
        point += f"TCTUNE_TOKEN=$(cat {token_file}) "
    elif settings.auth == "required":
        point += "TCTUNE_TOKEN=<a token of `tctune token create`> "
    click.echo(f"tctune: CLI: {point}tctune tune ...", err=True)


def api_only_app() -> Any:
    """The app of one `serve --workers N` process (settings from the environment)."""
    from api.app import create_app

    return _frozen(create_app(dispatcher=False))


def _frozen(app: Any) -> Any:
    """What is imported and built before serving lives as long as the process: keep it out
    of the collector's full passes (each walked ~125k objects, 50-140 ms on this 2-core
    machine, all of it added to the requests in flight: the p99 of GET /schedule)."""
    import gc

    gc.collect()
    gc.freeze()
    return app


@main.command()
@click.option("--procs", default=1, show_default=True, type=click.IntRange(1, 256),
              help="explorer processes taking explore messages (one job each at a time)")
@click.option("--threads", default=None, type=click.IntRange(1, 64),
              help="threads of one explorer process taking explore messages (one job each "
                   "at a time; they share its caches and models; PostgreSQL only) "
                   "[default: 2 on PostgreSQL without --procs, else 1]")
@click.option("--rounds-in-flight", default=None, type=click.IntRange(1, 8),
              help="rounds of one job proposed ahead of their measurement "
                   "[default: TCTUNE_ROUNDS_IN_FLIGHT or 2]")
@click.option("--prior-refresh-s", default=None, type=click.FloatRange(0),
              help="re-read other layers' measurements (the prior) at most this often "
                   "[default: TCTUNE_PRIOR_REFRESH_S or 30]")
def explorer(procs: int, threads: int | None, rounds_in_flight: int | None,
             prior_refresh_s: float | None) -> None:
    """The central explorer of the distributed fleet (queue 'explore' + the sweeper)."""
    from workers.fleet import run_explorer

    if procs > 1 and (threads or 1) > 1:
        raise click.ClickException("--procs and --threads: choose one of them")

    # Through the environment: the Celery tasks (and pool children) read their settings.
    if rounds_in_flight is not None:
        os.environ["TCTUNE_ROUNDS_IN_FLIGHT"] = str(rounds_in_flight)
    if prior_refresh_s is not None:
        os.environ["TCTUNE_PRIOR_REFRESH_S"] = str(prior_refresh_s)
    from store.settings import get_settings

    get_settings.cache_clear()
    settings = _distributed_settings()
    postgresql = settings.db_url.startswith("postgresql")
    if threads is None:
        # A second thread proposes while the first waits on the database or trains (both
        # without the GIL) (bench/RESULTS.md, "Fleet by simulation").
        threads = 2 if postgresql and procs == 1 else 1
    if threads > 1 and not postgresql:
        raise click.ClickException("--threads needs PostgreSQL (TCTUNE_DATABASE_URL): its "
                                   "row locks keep two threads from proposing for one job")
    run_explorer(settings, procs, threads)


@main.command()
@click.option("--concurrency", "-c", default=os.cpu_count() or 1, show_default=True, type=int,
              help="parallel NVRTC builds")
def builder(concurrency: int) -> None:
    """A CPU builder: compiles candidates (queue 'build')."""
    from workers.fleet import run_builder

    run_builder(_distributed_settings(), concurrency)


@main.command()
@click.option("--gpu", type=int, default=None, help="CUDA device index this process owns")
@click.option("--simulate", default=None, metavar="TARGET",
              help="measure with the analytical model of TARGET instead of a GPU")
@click.option("--slots", default=1, show_default=True, type=click.IntRange(1, 1024),
              help="simulated GPUs in this process (threads; --simulate only)")
def worker(gpu: int | None, simulate: str | None, slots: int) -> None:
    """One measuring worker: one process per GPU (queue 'measure.<target>')."""
    from kernels.spec import TARGETS
    from workers.fleet import run_worker

    if (gpu is None) == (simulate is None):
        raise click.UsageError("give exactly one of --gpu N or --simulate TARGET")
    if simulate is not None and simulate.lower() not in TARGETS:
        raise click.BadParameter(f"unknown target; known: {', '.join(TARGETS)}",
                                 param_hint="--simulate")
    if slots > 1 and simulate is None:
        raise click.UsageError("--slots is for simulated workers; a GPU gets one process")
    if gpu is not None:
        # Before anything touches CUDA: this process sees exactly its GPU, as device 0.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    run_worker(_distributed_settings(), gpu, simulate and simulate.lower(), slots)


def _distributed_settings() -> Any:
    import logging

    from store.settings import Settings

    settings = Settings()
    if not settings.broker_url:
        raise click.ClickException("set TCTUNE_BROKER_URL (e.g. redis://host:6379/0) and "
                                   "TCTUNE_DATABASE_URL for the distributed fleet")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return settings


def _first_token(settings: Any) -> None:
    """The embedded default's first start: an admin token, printed once and kept in the
    data dir (mode 0600) where the CLI on this machine finds it."""
    from store import repository as repo
    from store.db import session_scope

    with session_scope(settings.db_url) as s:
        if repo.count_tokens(s):
            return
        token = repo.create_token(s, "initial", "admin")
    path = settings.data_dir / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    click.echo(f"tctune: first start; admin token (also in {path}):\n  {token}", err=True)


@main.group()
def token() -> None:
    """API tokens (stored as hashes; shown once)."""


@token.command("create")
@click.option("--scope", type=click.Choice(["read", "tune", "admin"]), required=True)
@click.option("--name", default="cli", show_default=True)
def token_create(scope: str, name: str) -> None:
    """Create a token and print it (the only time it is shown)."""
    from store import repository as repo
    from store.db import session_scope
    from store.settings import Settings

    with session_scope(Settings().db_url) as s:
        click.echo(repo.create_token(s, name, scope))


@token.command("list")
def token_list() -> None:
    """List tokens (ids, names, scopes; never the tokens)."""
    from store import repository as repo
    from store.db import session_scope
    from store.settings import Settings

    with session_scope(Settings().db_url) as s:
        for t in repo.list_tokens(s):
            state = "revoked" if t.revoked_at else "active"
            click.echo(f"{t.id}\t{t.name}\t{t.scope}\t{state}\t{t.created_at:%Y-%m-%d}")


@token.command("revoke")
@click.argument("token_id", type=int)
def token_revoke(token_id: int) -> None:
    """Revoke a token by id."""
    from store import repository as repo
    from store.db import session_scope
    from store.settings import Settings

    with session_scope(Settings().db_url) as s:
        if not repo.revoke_token(s, token_id):
            raise click.ClickException(f"no active token {token_id}")
    click.echo(f"token {token_id} revoked")


@main.group()
def db() -> None:
    """Database schema migrations."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Migrate the database of TCTUNE_DATABASE_URL up to a revision."""
    from store import migrate
    from store.settings import Settings

    migrate.upgrade(Settings().db_url, revision)
    click.echo(f"database at {migrate.current_revision(Settings().db_url)}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Migrate the database down to REVISION ('base' for empty)."""
    from store import migrate
    from store.settings import Settings

    migrate.downgrade(Settings().db_url, revision)
    click.echo(f"database at {migrate.current_revision(Settings().db_url)}")


# --- the client -------------------------------------------------------------------------

server_option = click.option("--server", default=None, envvar="TCTUNE_SERVER",
                             help="API address [default http://127.0.0.1:8000]")


def _data_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # Read by _client through the environment, like the service's own TCTUNE_DATA_DIR.
    if value:
        os.environ["TCTUNE_DATA_DIR"] = value


def token_option(command: Any) -> Any:
    """--token, and --data DIR: where `tctune serve --data DIR` keeps its admin token."""
    command = click.option("--data", default=None, type=click.Path(file_okay=False),
                           expose_value=False, callback=_data_dir, is_eager=True,
                           help="data directory of the service (`tctune serve --data`): "
                                "its token is DIR/token [env TCTUNE_DATA_DIR]")(command)
    return click.option("--token", default=None, envvar="TCTUNE_TOKEN",
                        help="API token [default: DATA/token, ./tctune-data/token when "
                             "present]")(command)


def _client(server: str | None, token: str | None) -> Any:
    from api.client import DEFAULT_SERVER, Client
    from store.settings import Settings

    if token is None:
        local = Settings().data_dir / "token"
        token = local.read_text().strip() if local.is_file() else None
    return Client(server or DEFAULT_SERVER, token=token)


class StrategyHelp(click.Command):
    """A command whose --help ends with every strategy and its options (generated from their
    declarations, search/options.py). Imported only for --help: the search loads XGBoost."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        from search.registry import strategies_help

        formatter.write_paragraph()
        formatter.write_text("Strategies (--strategy NAME[:key=value...]) and their options:")
        for line in strategies_help().splitlines():
            formatter.write(f"  {line}\n")


STRATEGY_HELP = ("search strategy NAME[:key=value...], e.g. diversity:refit=1 (default: the "
                 "service's); the list below names each one's options")


def _strategy(spec: str | None) -> tuple[str | None, dict[str, Any] | None]:
    """--strategy NAME[:key=value...] -> (name, options as the strategy declares them)."""
    if spec is None or ":" not in spec:
        return spec, None  # a name alone: the service checks it
    # Only with options: the declarations import the search (XGBoost), slow for every start.
    from search.registry import parse_spec

    try:
        return parse_spec(spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--strategy") from None


@main.command(cls=StrategyHelp)
@click.option("--shape", "shape_text", required=True,
              help="n=8,h=56,w=56,c=64,k=64,r=3,s=3,pad=1 (pairs as 1x2)")
@click.option("--precision", required=True, type=click.Choice(["fp16", "int8", "int4", "fp32_tc"]))
@click.option("--target", required=True, help="t4, a100, a10, l4, h100, h200")
@click.option("--trials", default=500, show_default=True, type=int)
@click.option("--strategy", default=None, help=STRATEGY_HELP)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--wait", is_flag=True, help="show progress until the job ends")
@server_option
@token_option
def tune(shape_text: str, precision: str, target: str, trials: int, strategy: str | None,
         seed: int, wait: bool, server: str | None, token: str | None) -> None:
    """Submit a layer for tuning."""
    from api.client import TctuneError

    shape = _parse_shape(shape_text)
    name, options = _strategy(strategy)
    client = _client(server, token)
    try:
        resp = client.tune(shape, precision, target, trials, name, seed, options)
    except TctuneError as err:
        raise click.ClickException(explain(err.body)) from None
    verb = "queued" if resp["created"] else "already active"
    click.echo(f"job {resp['job_id']} {verb} for {resp['task_key']}", err=True)
    if not wait:
        click.echo(json.dumps(resp))
        return
    final = _wait_with_progress(client, resp["job_id"])
    if final["status"] != "done":
        raise click.ClickException(f"job {final['status']}: {final.get('error')}")
    best = client.schedule(shape, precision, target)
    click.echo(json.dumps(best, indent=2))


def _wait_with_progress(client: Any, job_id: int) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]job {task.fields[job]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("best {task.fields[best]}"), TimeElapsedColumn(),
                  transient=False) as bar:
        tid = bar.add_task("tune", total=None, job=job_id, best="-")

        def update(state: dict[str, Any]) -> None:
            best = state["best_us"]
            label = "-" if best is None else f"{best:.2f} us" + (
                " (simulated)" if state["simulated"] else "")
            bar.update(tid, total=state["trials"], completed=state["trials_done"], best=label)

        return client.wait(job_id, on_update=update)  # type: ignore[no-any-return]


@main.command()
@click.option("--shape", "shape_text", required=True)
@click.option("--precision", required=True, type=click.Choice(["fp16", "int8", "int4", "fp32_tc"]))
@click.option("--target", required=True)
@server_option
@token_option
def schedule(shape_text: str, precision: str, target: str, server: str | None,
             token: str | None) -> None:
    """Print the best schedule of a layer (exit 1 when none is known yet)."""
    from api.client import TctuneError

    client = _client(server, token)
    try:
        best, why = client.schedule_or_reason(_parse_shape(shape_text), precision, target)
    except TctuneError as err:
        raise click.ClickException(explain(err.body)) from None
    if best is None:
        click.echo(why, err=True)
        sys.exit(1)
    click.echo(json.dumps(best, indent=2))


@main.command("export")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="-",
              show_default=True, help="file to write ('-' for stdout)")
@click.option("--target", default=None)
@click.option("--precision", default=None)
@server_option
@token_option
def export_cmd(out_path: str, target: str | None, precision: str | None, server: str | None,
               token: str | None) -> None:
    """Export measurements and best schedules as JSON lines (schema in the README)."""
    from api.client import TctuneError

    try:
        text = _client(server, token).export(target, precision)
    except TctuneError as err:
        raise click.ClickException(explain(err.body)) from None
    with click.open_file(out_path, "w") as fh:
        fh.write(text)
    click.echo(f"exported {text.count(chr(10))} lines", err=True)


@main.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@server_option
@token_option
def import_cmd(path: str, server: str | None, token: str | None) -> None:
    """Import a JSON lines export (idempotent; an invalid file imports nothing)."""
    from api.client import TctuneError

    with click.open_file(path) as fh:
        text = fh.read()
    try:
        report = _client(server, token).import_lines(text)
    except TctuneError as err:
        body = err.body.get("detail") if isinstance(err.body, dict) else err.body
        if isinstance(body, dict) and "errors" in body:
            raise click.ClickException(
                body["msg"] + ":\n  " + "\n  ".join(body["errors"])) from None
        raise click.ClickException(explain(err.body)) from None
    click.echo(json.dumps(report))


@main.command("plan", cls=StrategyHelp)
@click.argument("model")
@click.option("--input-shape", default=None, metavar="N,C,H,W",
              help="the example input a module model is traced with (e.g. 8,3,224,224); "
                   "N is the batch the layers are tuned for")
@click.option("--precision", default=None, type=click.Choice(["fp16", "int8", "int4", "fp32_tc"]),
              help="of every layer of a module model; of a model file's layers that name none")
@click.option("--target", default=None,
              help="t4, a100, a10, l4, h100, h200: as --precision")
@click.option("--trials", default=128, show_default=True, type=click.IntRange(1),
              help="trials per submitted layer (on average, with --allocate time); at 128 "
                   "every layer of ResNet-50 ended within 5% of the best known schedule "
                   "(H200)")
@click.option("--allocate", default="time", show_default=True,
              type=click.Choice(["time", "even"]),
              help="time: more trials to the layers that take more of the model's time "
                   "(uses x estimated latency; 0.5-4x the average, by the square root of "
                   "the share); even: --trials each")
@click.option("--strategy", default=None, help=STRATEGY_HELP)
@click.option("--b2b", is_flag=True,
              help="also the layers that may run the 1x1 conv reading their output in their "
                   "kernel (a module model; ConvShape.b2b: tctune-deploy runs such a pair "
                   "as one kernel where its record beats the two layers')")
@click.option("--pixel-pairs", is_flag=True,
              help="also the pair layers of the stems (a module model; kernels.spec."
                   "pixel_pairs: tctune-deploy runs a stem over pixel pairs where that "
                   "layer's record beats the stem's)")
@click.option("--submit/--dry-run", default=True, show_default=True,
              help="submit the untuned layers, or only report coverage")
@click.option("--wait", is_flag=True,
              help="after submitting, show the progress of every job until all have ended, "
                   "then each layer's best latency and speedup")
@click.option("--timeout", default=None, type=click.FloatRange(0), metavar="SECONDS",
              help="with --wait: give up waiting after this long (the jobs go on)")
@server_option
@token_option
def plan_cmd(model: str, input_shape: str | None, precision: str | None, target: str | None,
             trials: int, allocate: str, strategy: str | None, b2b: bool, pixel_pairs: bool,
             submit: bool, wait: bool, timeout: float | None, server: str | None,
             token: str | None) -> None:
    """Tune a whole model: look its conv layers up, submit each distinct untuned one once
    (layers of the same shape share a task and its job), report coverage.

    MODEL is a JSON model file ({"precision", "target", "layers": [{"name", "shape"},
    ...]}), or a PyTorch module built here with random weights and traced once with a
    random input of --input-shape: `torchvision:NAME` (e.g. torchvision:resnet50) or
    `module.path:factory` (a function returning a torch.nn.Module, imported from the
    working directory or the environment); a module model needs --precision and --target.
    Grouped convolutions are left out (the kernel does groups=1). The submitted layers
    share --trials per layer: by default the layers that take more of the model's time get
    more (--allocate).

    \b
    Examples:
      tctune plan model.json --dry-run
      tctune plan torchvision:resnet50 --input-shape 8,3,224,224 --precision int8 \\
          --target h100 --trials 200 --submit --wait

    The summary goes to stderr and a JSON object to stdout: layers, distinct, tuned,
    submitted, running, and with --wait the jobs' end states and every layer's best
    schedule, latency, baseline and speedup.
    """
    from rich.console import Console

    from api.client import TctuneError
    from api.plan import is_module_spec, load_model, load_module_model, parse_input_shape, plan

    # Usage errors too are one line here (a model's problems are the common ones).
    if wait and not submit:
        raise click.ClickException("--wait follows the jobs --submit starts; drop --dry-run")
    strategy_name, strategy_options = _strategy(strategy)
    module_model = not Path(model).exists() and is_module_spec(model)
    if not module_model and not Path(model).is_file():
        raise click.ClickException(f"{model}: no such file, nor torchvision:NAME or "
                                   "module.path:factory")
    if module_model:
        missing = [f"--{n.replace('_', '-')}" for n, v in (
            ("input_shape", input_shape), ("precision", precision), ("target", target)) if not v]
        if missing:
            raise click.ClickException(f"{model}: a module model needs {', '.join(missing)}")
    try:
        if module_model:
            assert input_shape and precision and target
            layers = load_module_model(model, parse_input_shape(input_shape), precision,
                                       target.lower(), b2b, pixel_pairs)
        else:
            layers = load_model(model, precision, target and target.lower())
    except ValueError as err:
        raise click.ClickException(f"{model}: {err}") from None
    client = _client(server, token)
    console = Console(stderr=True)

    def on_wait(seconds: float) -> None:
        console.print(f"the service's limit on submissions: waiting {seconds:g} s")

    try:
        cov = plan(client, layers, trials, submit=submit, strategy=strategy_name,
                   strategy_options=strategy_options, allocate=allocate, on_wait=on_wait)
    except TctuneError as err:
        raise click.ClickException(explain(err.body)) from None
    console.print(_coverage_table(cov.rows))
    console.print(f"coverage: {cov.tuned}/{cov.distinct} distinct layers tuned "
                  f"({cov.layers} layers); submitted {cov.submitted}, already running "
                  f"{cov.running}")
    out: dict[str, Any] = {"layers": cov.layers, "distinct": cov.distinct, "tuned": cov.tuned,
                           "submitted": cov.submitted, "running": cov.running}
    if not wait:
        click.echo(json.dumps(out))
        return
    try:
        states = _wait_for_jobs(client, cov.jobs, console, timeout)
        final = client.lookup([(la.shape, la.precision, la.target) for la in layers])
    except TctuneError as err:
        raise click.ClickException(explain(err.body)) from None
    except TimeoutError as err:
        raise click.ClickException(f"{err}; `tctune plan {model} --dry-run` shows "
                                   "coverage later") from None
    results = [{"name": la.name, "task_key": res["task_key"],
                "job_id": row["job_id"], "trials": row["trials"], "found": res["found"],
                "schedule": res.get("schedule"),
                "latency_us": res.get("latency_us"), "simulated": res.get("simulated"),
                "simulated_note": res.get("simulated_note"),
                "baseline": res.get("baseline"), "baseline_us": res.get("baseline_us"),
                "speedup": res.get("speedup")}
               for la, res, row in zip(layers, final, cov.rows, strict=True)]
    console.print(_results_table(results, states))
    ended: dict[str, int] = {}
    for state in states.values():
        ended[state["status"]] = ended.get(state["status"], 0) + 1
    tuned = len({r["task_key"] for r in results if r["found"]})
    jobs_line = ", ".join(f"{n} {st}" for st, n in sorted(ended.items())) or "none"
    console.print(f"done: {tuned}/{cov.distinct} distinct layers tuned; jobs: {jobs_line}")
    click.echo(json.dumps({**out, "jobs": ended, "results": results}))
    bad = sorted((j, s) for j, s in states.items() if s["status"] != "done")
    if bad:
        first_id, first = bad[0]
        why = f": {first['error']}" if first.get("error") else ""
        raise click.ClickException(f"{len(bad)} of {len(states)} jobs did not finish (job "
                                   f"{first_id} {first['status']}{why})")


def _coverage_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table("layer", "task", "state", "trials", "latency (us)")
    for row in rows:
        lat = "" if row["latency_us"] is None else f"{row['latency_us']:.2f}"
        trials = "" if row["trials"] is None else str(row["trials"])
        table.add_row(row["name"], row["task_key"], row["state"], trials, lat)
    return table


def _layer_label(names: list[str], width: int = 24) -> str:
    """A job's layers in one short label: the first name, and how many more share it."""
    more = f" +{len(names) - 1}" if len(names) > 1 else ""
    first = names[0] if len(names[0]) + len(more) <= width else \
        names[0][:max(1, width - len(more) - 1)] + "…"
    return first + more


def _wait_for_jobs(client: Any, jobs: dict[int, list[str]], console: Any,
                   timeout: float | None) -> dict[int, dict[str, Any]]:
    """One progress display for all the jobs of a plan: the model's trials and jobs ended
    on top, a row per job below (its layers; trials; state, best so far and speedup)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not jobs:
        return {}
    # Narrow columns: a log or CI console is 80 wide, and rich drops what does not fit.
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=16),
                  MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        total = bar.add_task(f"model, {len(jobs)} jobs", total=None, info="")
        rows = {job_id: bar.add_task(f"{job_id:>4} {_layer_label(names)}", total=None,
                                     info="queued")
                for job_id, names in jobs.items()}

        def update(states: dict[int, dict[str, Any]]) -> None:
            for job_id, st in states.items():
                best, speedup = st["best_us"], st.get("speedup")
                info = st["status"] + ("" if best is None else f" {best:.2f}us") + (
                    "" if not speedup else f" {speedup:.2f}x")
                bar.update(rows[job_id], total=st["trials"], completed=st["trials_done"],
                           info=info)
            ended = sum(st["status"] in ("done", "failed", "cancelled")
                        for st in states.values())
            simulated = any(st["simulated"] for st in states.values())
            bar.update(total, total=sum(st["trials"] for st in states.values()),
                       completed=sum(min(st["trials_done"], st["trials"])
                                     for st in states.values()),
                       info=f"{ended}/{len(jobs)} jobs ended" + (" (sim)" if simulated else ""))

        # A pass asks each active job once: a longer period for many jobs.
        poll = min(2.0, 0.25 + 0.05 * len(jobs))
        return client.wait_many(  # type: ignore[no-any-return]
            list(jobs), poll_s=poll, on_update=update, timeout_s=timeout)


def _results_table(results: list[dict[str, Any]], states: dict[int, dict[str, Any]]) -> Any:
    """Each distinct layer once: its layers, job and end state, best latency, baseline
    and speedup."""
    from rich.table import Table

    names = {r["baseline"] for r in results}
    one_baseline = names.pop() if len(names) == 1 else None
    simulated = {bool(r["simulated"]) for r in results if r["found"]}
    notes = sorted({r["simulated_note"] for r in results if r.get("simulated_note")})
    caption = "; ".join((["simulated: latencies of the analytical model"]
                         if simulated == {True} else []) + notes) or None
    table = Table("layers", "job", "state", "best (us)",
                  f"{one_baseline} (us)" if one_baseline else "baseline (us)", "speedup",
                  caption=caption)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(r["task_key"], []).append(r)
    for group in groups.values():
        r = group[0]
        job = "" if r["job_id"] is None else str(r["job_id"])
        state = states[r["job_id"]]["status"] if r["job_id"] in states else \
            ("tuned" if r["found"] else "untuned")
        best = "" if r["latency_us"] is None else f"{r['latency_us']:.2f}" + (
            " sim" if r["simulated"] and len(simulated) > 1 else "")
        base = "" if r["baseline_us"] is None else f"{r['baseline_us']:.2f}" + (
            "" if one_baseline else f" {r['baseline']}")
        speedup = "" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        table.add_row(_layer_label([g["name"] for g in group], 32), job, state, best, base,
                      speedup)
    return table


# --- benchmarks -------------------------------------------------------------------------

@main.group()
def bench() -> None:
    """Offline benchmarks."""


@bench.command("search", context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_search(args: tuple[str, ...]) -> None:
    """Replay search strategies on recorded exhaustive datasets (see --help of the replay)."""
    from search import replay

    sys.exit(replay.main(list(args)))


if __name__ == "__main__":
    main()

