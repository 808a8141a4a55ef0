"""The ``fedtune`` command."""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from fedtune.errors import RunError
from fedtune.flower.cli import flower_app

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(
    help="Federated fine-tuning of large language models when clients cannot hold the large model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="The offline model zoo.", no_args_is_help=True)
data_app = typer.Typer(help="Built-in datasets and partitions.", no_args_is_help=True)
align_app = typer.Typer(help="Token alignment between two tokenizers (FedMKT).", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(data_app, name="data")
app.add_typer(align_app, name="align")
app.add_typer(flower_app, name="flower")

console = Console(stderr=True)
# Piped output (files, CI logs) gets wide tables instead of 80-column wrapping.
out = Console() if sys.stdout.isatty() else Console(width=200)

VARIANT_HELP = "a named variant of the run's final model (e.g. adapfu or adapemu); default: the first"
OPTION_HELP = "KEY=VALUE for the run's final model (e.g. alpha=0.8 for a proxy-tuned model; repeatable)"
BACKENDS = ("simulation", "flower", "ray")
QUIET_HUGGING_FACE = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
}
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    KeyError,
    FileNotFoundError,
    FileExistsError,
    RunError,
)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    for noisy in ("httpx", "urllib3", "datasets", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _quiet_hugging_face()
    logging.getLogger("absl").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")


def _quiet_hugging_face() -> None:
    """No progress bars and only errors from transformers and datasets, without importing them.

    They read these variables when they load, which most commands never make them do: importing them
    here cost every command, ``--help`` included, seconds of CPU.
    """
    for name, value in QUIET_HUGGING_FACE.items():
        os.environ.setdefault(name, value)
    if "transformers" in sys.modules:  # loaded already (e.g. in a test process): configure it directly
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()


def _fail(exc: BaseException) -> None:
    message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    # soft_wrap: a long path or "file line N" must stay on one line (readable, and greppable).
    console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(code=2)


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False) -> None:
    _setup_logging(verbose)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. fed.rounds=5")] = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="default runs/<name>")] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="simulation (in-process), flower (a local Flower deployment: SuperLink + one "
            "SuperNode per client on loopback) or ray (Ray actors, the ray section); default: the config's "
            "fed.backend"
        ),
    ] = None,
) -> None:
    """Run an experiment: config + overrides -> metrics, checkpoints and artifacts in the run directory."""
    from fedtune.config import load_config

    try:
        cfg = load_config(config, overrides or [])
        if backend is not None:
            if backend not in BACKENDS:
                raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
            cfg.fed.backend = backend  # type: ignore[assignment]
        run_dir = output_dir or cfg.run_dir()
        from fedtune.rundata import pin_data_paths

        pin_data_paths(cfg)  # before any other process (Flower's) reads the config
        console.print(f"run [bold]{cfg.name}[/] ({cfg.algorithm}, {cfg.fed.backend}) -> {run_dir}")
        _run_on_backend(cfg, run_dir, resume=False)
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    console.print(f"done: {run_dir}/metrics.jsonl; `fedtune report {run_dir}` for plots")


@app.command()
def resume(run_dir: Annotated[Path, typer.Argument(help="a run directory")]) -> None:
    """Continue a run from its last complete round (on the backend the run was started with)."""
    from fedtune.config import load_run_config
    from fedtune.data.records import DataError

    try:
        if not (run_dir / "config.yaml").is_file():
            raise DataError(f"{run_dir} is not a run directory (no config.yaml)")
        _run_on_backend(load_run_config(run_dir), run_dir, resume=True)
    except EXPECTED_ERRORS as exc:
        _fail(exc)


def _run_on_backend(cfg: Any, run_dir: Path, resume: bool) -> None:
    try:
        _run_on_backend_uninterrupted(cfg, run_dir, resume)
    except KeyboardInterrupt:
        from fedtune.fl.checkpoint import intact_checkpoint

        path, _ = intact_checkpoint(run_dir)
        done = (
            f"round {int(path.name.split('_')[1])} is the last complete one" if path else "no round finished"
        )
        console.print(f"interrupted ({done}); continue with: fedtune resume {run_dir}", soft_wrap=True)
        raise typer.Exit(code=130) from None


def _run_on_backend_uninterrupted(cfg: Any, run_dir: Path, resume: bool) -> None:
    if cfg.fed.backend == "flower":
        from fedtune.tracking import require_trackers

        require_trackers(cfg.report_to)  # here, before the deployment starts (its server app logs them)
        from fedtune.flower.local import run_local
        from fedtune.flower.processes import DeploymentError
        from fedtune.progress import print_run_summary

        try:
            run_local(cfg, run_dir, resume=resume)
        except DeploymentError as exc:
            _fail(exc)
        print_run_summary(run_dir, cfg.name, console)
        return
    from fedtune.runner import Runner

    Runner(cfg, run_dir, console=console).run(resume=resume)


def _options(pairs: list[str] | None) -> dict[str, str]:
    """``--option KEY=VALUE`` pairs as a dict; a malformed pair is an error naming it."""
    options: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            _fail(ValueError(f"--option {pair!r}: expected KEY=VALUE"))
        options[key] = value
    return options


@app.command("eval")
def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    split: Annotated[str | None, typer.Option(help="dataset split (default: the run's eval split)")] = None,
    max_examples: Annotated[int | None, typer.Option(help="evaluate on at most N examples")] = None,
    variant: Annotated[str | None, typer.Option(help=VARIANT_HELP)] = None,
    option: Annotated[list[str] | None, typer.Option(help=OPTION_HELP)] = None,
    harness: Annotated[
        str | None, typer.Option(help="lm-eval: score with EleutherAI's lm-evaluation-harness instead")
    ] = None,
    tasks: Annotated[
        str | None, typer.Option(help="with --harness: T1,T2 (fedtune-<set> or any lm-eval task); 'list'")
    ] = None,
    client: Annotated[
        str | None, typer.Option(help="a client's personal model (PerFIT): --option client=")
    ] = None,
    output: Annotated[
        str,
        typer.Option(
            help="the scores' file, relative to the run directory: another variant's or example count's "
            "beside the first (e.g. eval-adapfu.json)"
        ),
    ] = "eval.json",
) -> None:
    """Evaluate the final model of a run; writes eval.json in the run directory (--output names another
    file; eval-lm-eval.json with --harness lm-eval)."""
    from fedtune.artifacts import evaluate_run

    options = _options(option) | ({"client": client} if client else {})
    if harness is not None:
        if split is not None:
            _fail(ValueError("--split is for fedtune's own evaluation: lm-eval tasks name their split"))
        if output != "eval.json":
            _fail(ValueError("--output is for fedtune's own evaluation: lm-eval writes eval-lm-eval.json"))
        _evaluate_harness(run_dir, harness, tasks, max_examples, variant, options)
        return
    if tasks is not None:
        _fail(ValueError("--tasks goes with --harness lm-eval"))
    from fedtune.progress import generation_progress

    try:
        with generation_progress(console):
            result = evaluate_run(
                run_dir,
                split=split,
                max_examples=max_examples,
                variant=variant,
                options=options,
                output=output,
            )
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    table = Table(title=f"{run_dir}: final model")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for metric, value in result.metrics.items():
        table.add_row(metric, f"{value:.4f}")
    out.print(table)


def _evaluate_harness(
    run_dir: Path,
    harness: str,
    tasks: str | None,
    max_examples: int | None,
    variant: str | None,
    options: dict[str, str],
) -> None:
    from fedtune.harness import list_tasks, run_harness

    if harness != "lm-eval":
        _fail(ValueError(f"--harness {harness!r}: the one harness is lm-eval"))
    names = [name.strip() for name in (tasks or "").split(",") if name.strip()]
    try:
        if names == ["list"]:
            print("\n".join(list_tasks()))
            return
        scores = run_harness(run_dir, names, max_examples=max_examples, variant=variant, options=options)
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    table = Table(title=f"{run_dir}: final model, lm-eval")
    for column in ("task", "metric", "value", "stderr"):
        table.add_column(column, justify="right" if column in ("value", "stderr") else "left")
    for task, metrics in scores.items():
        for metric, value in metrics.items():
            if not metric.endswith("_stderr"):
                stderr = metrics.get(f"{metric}_stderr")
                table.add_row(task, metric, f"{value:.4f}", "" if stderr is None else f"{stderr:.4f}")
    out.print(table)


@app.command()
def generate(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    prompt: Annotated[list[str], typer.Option("--prompt", "-p", help="instruction text (repeatable)")],
    max_new_tokens: Annotated[int, typer.Option(help="tokens to generate")] = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy")] = 0.0,
    top_p: Annotated[float, typer.Option(help="nucleus sampling mass")] = 1.0,
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    raw: Annotated[bool, typer.Option(help="send the prompt as is, without the run's template")] = False,
    variant: Annotated[str | None, typer.Option(help=VARIANT_HELP)] = None,
    option: Annotated[list[str] | None, typer.Option(help=OPTION_HELP)] = None,
) -> None:
    """Generate with the final model of a run (the run's prompt template is applied).

    The final model is the run's method's: e.g. the proxy-tuned large model of a proxy-tuning run.
    """
    from fedtune.artifacts import generate_from_run, random_model_note

    try:
        note = random_model_note(run_dir)
        texts = generate_from_run(
            run_dir,
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            raw=raw,
            variant=variant,
            options=_options(option),
        )
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    for question, answer in zip(prompt, texts, strict=True):
        out.print(f"[bold]>>> {question}[/]\n{answer}\n")
    if note is not None:
        console.print(note, soft_wrap=True)


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="a finished run directory")],
    format: Annotated[
        str, typer.Option("--format", "-f", help="peft (adapter dir) | merged (transformers dir) | gguf")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="a new or empty directory")],
    variant: Annotated[str | None, typer.Option(help=VARIANT_HELP)] = None,
    option: Annotated[list[str] | None, typer.Option(help=OPTION_HELP)] = None,
    converter: Annotated[
        str | None,
        typer.Option(
            help="gguf: llama.cpp's convert_hf_to_gguf.py (or its directory); default "
            "$FEDTUNE_GGUF_CONVERTER, else the one fetched once from the pinned llama-cpp-python sdist"
        ),
    ] = None,
    outtype: Annotated[str, typer.Option(help="gguf: f32 | f16 | bf16 | q8_0 | auto")] = "f16",
) -> None:
    """Write a run's final model as a peft adapter, a merged transformers model or GGUF.

    What the final model is depends on the method: e.g. FedPT exports its small LM with the adapter.
    """
    from fedtune.export import export_run

    try:
        result = export_run(
            run_dir,
            format,
            output,
            variant=variant,
            options=_options(option),
            converter=converter,
            outtype=outtype,
        )
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    out.print(f"wrote {result.output} ({result.format}): {result.what}", soft_wrap=True)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    compare: Annotated[list[Path] | None, typer.Option(help="other run directories to compare")] = None,
) -> None:
    """Write report.md and plots/ (learning curves, per-category scores, bytes per round)."""
    from fedtune.report import write_report

    try:
        path = write_report(run_dir, compare=compare or None)
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    out.print(f"wrote {path}")


@app.command()
def serve(
    target: Annotated[
        str, typer.Argument(help="a finished run directory, or a model (zoo/tiny name, directory)")
    ],
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one)")] = 8000,
    host: Annotated[str, typer.Option(help="listen address (not loopback: --allow-remote)")] = "127.0.0.1",
    allow_remote: Annotated[bool, typer.Option(help="allow a --host other machines can reach")] = False,
    api_key: Annotated[
        str | None, typer.Option(help="bearer token every request must send (default: $FEDTUNE_API_KEY)")
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(help="the name clients ask for (default: the model name or run directory name)"),
    ] = None,
    max_logprobs: Annotated[
        int, typer.Option(help="a model: the most log-probabilities per position (-1: the vocabulary)")
    ] = 20,
    dtype: Annotated[str, typer.Option(help="a model: fp32, bf16 or fp16")] = "fp32",
    device: Annotated[str, typer.Option(help="a model: auto, cpu, cuda")] = "auto",
    seed: Annotated[int, typer.Option(help="a model: the initialisation of a tiny random model")] = 0,
    variant: Annotated[str | None, typer.Option(help=VARIANT_HELP)] = None,
    option: Annotated[list[str] | None, typer.Option(help=OPTION_HELP)] = None,
    max_concurrent: Annotated[
        int, typer.Option(min=1, help="requests in flight at once; one more is answered 429")
    ] = 64,
) -> None:
    """Serve a finished run's final model (OpenAI chat and completions, streaming) or a model's next-token
    log-probabilities (the vLLM completions subset FedPT's HTTP large model uses). See docs/serving.md."""
    from fedtune.serve import build_app, check_bind
    from fedtune.serve.launch import (
        API_KEY_ENV,
        LISTEN_BACKLOG,
        bound_port,
        open_socket,
        serve_forever,
        url_host,
    )

    key = api_key or os.environ.get(API_KEY_ENV) or None
    try:
        for warning in check_bind(host, allow_remote, key):
            console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
        sock = open_socket(host, port)  # before the model loads: a taken port fails at once
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    try:
        service, what = _serve_target(
            target, served_model_name, max_logprobs, dtype, device, seed, variant, option
        )
    except EXPECTED_ERRORS as exc:
        sock.close()
        _fail(exc)
    sock.listen(LISTEN_BACKLOG)  # from here a client connects (and waits for uvicorn's first accept)
    console.print(
        f"serving {what} as {service.name!r} on http://{url_host(host)}:{bound_port(sock)}/v1"
        + (" (API key required)" if key else ""),
        soft_wrap=True,
    )
    serve_forever(build_app(service, api_key=key, max_concurrent=max_concurrent), sock)


def _serve_target(
    target: str,
    served_model_name: str | None,
    max_logprobs: int,
    dtype: str,
    device: str,
    seed: int,
    variant: str | None,
    option: list[str] | None,
) -> tuple[Any, str]:
    """``fedtune serve``'s service for ``target`` (a run directory or a model) and how to name it."""
    from fedtune.serve import logits_service, run_service

    path = Path(target)
    if (path / "config.yaml").is_file():
        service: Any = run_service(
            path, served_name=served_model_name, variant=variant, options=_options(option)
        )
        what = f"run {path} ({service.final.cfg.algorithm})"
    else:
        if variant or option:
            raise ValueError("--variant and --option apply to a run directory, not to a model")
        service = logits_service(
            target,
            served_name=served_model_name,
            max_logprobs=max_logprobs,
            dtype=dtype,
            device=device,
            seed=seed,
        )
        what = f"model {target} (log-probabilities, at most {service.max_logprobs} per position)"
    return service, what


CacheOption = Annotated[
    Path | None, typer.Option("--cache-dir", help="model cache (default $FEDTUNE_CACHE or ~/.cache/fedtune)")
]


def _rows_table(title: str, rows: list[dict[str, str]]) -> Table:
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*[str(v) for v in row.values()])
    return table


@models_app.command("list")
def models_list(cache_dir: CacheOption = None) -> None:
    """The offline zoo and the derived models: name, size, where they are cached."""
    from fedtune.models.zoo import default_cache_dir, zoo_table

    out.print(_rows_table("fedtune model zoo", zoo_table(cache_dir)))
    # Checked first so that listing the zoo does not pay for importing torch when nothing was derived.
    if ((cache_dir or default_cache_dir()) / "derived").is_dir():
        from fedtune.models.derived import derived_table

        rows = derived_table(cache_dir)
        if rows:
            out.print(_rows_table("derived models (fedtune models derive)", rows))


@models_app.command("fetch")
def models_fetch(
    name: Annotated[str, typer.Argument(help="zoo name")], cache_dir: CacheOption = None
) -> None:
    """Download, verify (sha256) and convert a zoo model once into the cache."""
    from fedtune.models.zoo import fetch

    try:
        path = fetch(name, cache_dir)
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    out.print(str(path))


@models_app.command("path")
def models_path(name: Annotated[str, typer.Argument(help="zoo name")], cache_dir: CacheOption = None) -> None:
    """Print where a zoo model is cached (exit 1 if not fetched yet)."""
    from fedtune.models.zoo import get_entry, zoo_path

    try:
        get_entry(name)
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    path = zoo_path(name, cache_dir)
    if path is None:
        console.print(f"{name} is not fetched yet: run `fedtune models fetch {name}`")
        raise typer.Exit(code=1)
    out.print(str(path))


@models_app.command("derive")
def models_derive(
    source: Annotated[str, typer.Argument(help="model to derive from: a zoo name or any causal LM name")],
    layers: Annotated[int, typer.Option(help="decoder layers to keep (uniform stride, first and last kept)")],
    steps: Annotated[int, typer.Option(help="distillation steps (~5 s each for SmolLM2 on 2 cores)")] = 120,
    name: Annotated[str | None, typer.Option(help="name to save under (default <source>-l<layers>)")] = None,
    batch_size: Annotated[int, typer.Option(help="texts per distillation step")] = 8,
    max_length: Annotated[int, typer.Option(help="tokens per text")] = 128,
    lr: Annotated[float, typer.Option(help="peak AdamW learning rate")] = 5e-4,
    seed: Annotated[int, typer.Option(help="seed of the data order")] = 0,
    force: Annotated[bool, typer.Option(help="replace a derived model of the same name")] = False,
    cache_dir: CacheOption = None,
) -> None:
    """A smaller model with the same vocabulary: keep some decoder layers, distil from the full model."""
    from fedtune.train.distill import derive_model

    try:
        result = derive_model(
            source, keep_layers=layers, steps=steps, name=name, cache_dir=cache_dir, seed=seed,
            batch_size=batch_size, max_length=max_length, lr=lr, overwrite=force,
        )  # fmt: skip
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    table = Table(
        title=f"{result.name}: {len(result.kept_layers)} of {result.source_layers} layers of {source}"
    )
    table.add_column("")
    table.add_column("value")
    ppl_where = f"perplexity on {result.held_out_texts} held-out public texts"
    for label, value in (
        (f"teacher {ppl_where}", f"{result.teacher_ppl:,.2f}"),
        ("student before distillation", f"{result.student_ppl_before:,.2f}"),
        ("student after distillation", f"{result.student_ppl_after:,.2f}"),
        ("layers kept", ", ".join(map(str, result.kept_layers))),
        ("params (student / teacher)", f"{result.params / 1e6:.1f}M / {result.source_params / 1e6:.1f}M"),
        (
            "distillation",
            f"{result.steps} steps, batch {result.batch_size} x {result.max_length}, lr {result.lr:g}",
        ),
        ("seconds (distillation / total)", f"{result.distill_seconds:.0f} / {result.seconds:.0f}"),
        ("saved to", result.path),
    ):
        table.add_row(label, value)
    out.print(table)


@data_app.command("list")
def data_list() -> None:
    """The built-in datasets."""
    from fedtune.data.builtin import list_builtin

    table = Table(title="built-in datasets")
    for column in ("name", "task", "categories", "splits", "description"):
        table.add_column(column)
    for info in list_builtin():
        splits = ", ".join(f"{k} {v}" for k, v in info.splits.items())
        table.add_row(info.name, info.task, str(len(info.categories)), splits, info.description)
    out.print(table)


@data_app.command("show")
def data_show(
    name: Annotated[str, typer.Argument(help="built-in dataset")],
    split: Annotated[str, typer.Option(help="split")] = "train",
    n: Annotated[int, typer.Option(help="examples to show")] = 3,
    category: Annotated[str | None, typer.Option(help="only this category")] = None,
) -> None:
    """Describe a built-in dataset and print a few examples."""
    from fedtune.data.builtin import builtin_info, load_builtin

    try:
        info = builtin_info(name)
        records = load_builtin(name, split)
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    out.print(f"[bold]{info.name}[/] ({info.task}): {info.description}")
    out.print(f"splits: {info.splits}\ncategories: {', '.join(info.categories)}\nlicence: {info.licence}\n")
    shown = [r for r in records if category is None or r.category == category][:n]
    for rec in shown:
        out.print(json.dumps(rec.to_dict(), ensure_ascii=False, indent=1))


@data_app.command("stats")
def data_stats(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides")] = None,
    plot: Annotated[Path | None, typer.Option(help="where to save the plot")] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="the run directory (default runs/<name>)")
    ] = None,
) -> None:
    """The per-client x category table of a config's partition, printed and saved as a plot.

    The plot goes with the run's other outputs: ``<run dir>/plots/partition.png`` unless ``--plot``.
    """
    from fedtune.config import load_config
    from fedtune.data.partition import category_counts
    from fedtune.report import partition_table, plot_partition
    from fedtune.rundata import prepare_data

    try:
        cfg = load_config(config, overrides or [])
        data = prepare_data(cfg)
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    counts = category_counts(data.clients)
    out.print(partition_table(counts))
    target = plot or (output_dir or cfg.run_dir()) / "plots" / "partition.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    part = cfg.data.partition
    plot_partition(counts, target, f"{cfg.data.dataset}: {part.scheme} over {len(counts)} clients")
    out.print(f"plot: {target}")


MapCacheOption = Annotated[
    Path | None, typer.Option("--map-cache", help="vocabulary map cache (default <fedtune cache>/align)")
]


@align_app.command("vocab")
def align_vocab(
    source: Annotated[str, typer.Argument(help="source model (any model name, tiny ones included)")],
    target: Annotated[str, typer.Argument(help="target model")],
    examples: Annotated[int, typer.Option(help="inexact mappings to show")] = 8,
    cache_dir: CacheOption = None,
    map_cache: MapCacheOption = None,
) -> None:
    """The minimum-edit-distance vocabulary map SOURCE -> TARGET: coverage, distances, time."""
    import time

    from fedtune.align import VocabMapStats, preferred_ids, vocab_map_of_strings, vocabulary_strings
    from fedtune.align.report import distance_histogram, mapping_examples, vocab_summary
    from fedtune.align.vocab import cache_path
    from fedtune.models.loading import load_tokenizer

    try:
        source_strings = vocabulary_strings(load_tokenizer(source, cache_dir=cache_dir))
        target_tokenizer = load_tokenizer(target, cache_dir=cache_dir)
        target_strings = vocabulary_strings(target_tokenizer)
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    cached = cache_path(source_strings, target_strings, map_cache).is_file()
    started = time.perf_counter()
    preferred = preferred_ids(target_tokenizer, target_strings)
    vmap = vocab_map_of_strings(
        source_strings, target_strings, cache_dir=map_cache, progress=True, preferred=preferred
    )
    stats = VocabMapStats.of(source_strings, target_strings, vmap, time.perf_counter() - started)
    out.print(vocab_summary(source, target, stats, cached))
    out.print(distance_histogram(stats))
    inexact = [i for i, j in enumerate(vmap.tolist()) if source_strings[i] != target_strings[j]]
    shown = inexact[:: max(1, len(inexact) // examples)][:examples] if examples > 0 else []
    if shown:
        out.print(mapping_examples(source_strings, target_strings, vmap, shown))


@align_app.command("show")
def align_show(
    source: Annotated[str, typer.Argument(help="source model")],
    target: Annotated[str, typer.Argument(help="target model")],
    text: Annotated[str, typer.Argument(help="the text to tokenize with both")],
    cache_dir: CacheOption = None,
) -> None:
    """Both tokenizations of TEXT and their DTW alignment, 1:1 matches marked."""
    from fedtune.align import align_sequences, display_token, one_to_one, token_strings
    from fedtune.align.report import alignment_table
    from fedtune.models.loading import load_tokenizer

    try:
        tokenizers = [load_tokenizer(name, cache_dir=cache_dir) for name in (source, target)]
    except EXPECTED_ERRORS as exc:
        _fail(exc)
    strings = [token_strings(tok, tok(text, add_special_tokens=False)["input_ids"]) for tok in tokenizers]
    for name, tokens in zip((source, target), strings, strict=True):
        out.print(f"[bold]{name}[/] ({len(tokens)} tokens): " + " | ".join(display_token(t) for t in tokens))
    source_strings, target_strings = strings
    path = align_sequences(source_strings, target_strings)
    match = one_to_one(source_strings, target_strings)
    out.print(alignment_table(source, target, source_strings, target_strings, path, match))
    out.print(f"1:1 matches: {int((match >= 0).sum())} of {len(target_strings)} target tokens")
