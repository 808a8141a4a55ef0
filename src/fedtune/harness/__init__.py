"""A finished run's final model in EleutherAI's lm-evaluation-harness (the optional ``eval`` extra):
``fedtune eval RUN --harness lm-eval --tasks T1,T2``.

``run_harness`` loads the final model (variant, options), wraps it as lm-eval's ``fedtune`` model
(``harness.model``), exports the built-in test sets as offline tasks into the run directory
(``harness.tasks``) and runs the named tasks: fedtune's own (``fedtune-<set>``) or any task lm-eval
knows (they need its data, from the hub or its cache). The scores go to ``eval-lm-eval.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedtune.errors import RunError
from fedtune.suggest import closest

RESULTS_FILE = "eval-lm-eval.json"
TASKS_DIR_NAME = "lm-eval-tasks"
"""The run directory's folder of exported tasks (data and YAML), for ``lm_eval --include_path``."""


class HarnessError(RunError):
    """lm-eval is missing or was asked for a task it does not know (named in the message)."""


def require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise HarnessError(
            "--harness lm-eval needs lm-evaluation-harness: pip install 'fedtune[eval]'"
        ) from None


def task_manager(include_path: Path | None = None, *, lm_eval_tasks: bool = True) -> Any:
    """fedtune's built-in sets (from ``include_path``, default the package's YAMLs) and, with
    ``lm_eval_tasks``, lm-eval's own (indexing its thousands of YAMLs takes seconds)."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    from fedtune.harness.tasks import TASKS_DIR

    return TaskManager(include_path=str(include_path or TASKS_DIR), include_defaults=lm_eval_tasks)


def list_tasks() -> list[str]:
    """Every task name lm-eval can run here: fedtune's built-in sets first, then lm-eval's own."""
    from fedtune.harness.tasks import builtin_task_names

    ours = builtin_task_names()
    return ours + [name for name in task_manager().all_tasks if name not in ours]


def check_tasks(tasks: Sequence[str], known: Sequence[str], *, allow_empty: bool = False) -> None:
    """Refuse a task name lm-eval does not know, with the closest known one."""
    if not tasks and not allow_empty:
        raise HarnessError("--tasks is empty: name one or more tasks (`--tasks list` shows them)")
    for name in tasks:
        if name not in known:
            close = closest(name, known)
            hint = f"; did you mean {close!r}?" if close else ""
            raise HarnessError(f"--tasks: lm-eval has no task {name!r}{hint} (`--tasks list` shows them)")


def run_harness(
    run_dir: Path,
    tasks: Sequence[str],
    *,
    max_examples: int | None = None,
    variant: str | None = None,
    options: Mapping[str, str] | None = None,
    batch_size: int | None = None,
) -> dict[str, dict[str, float]]:
    """The run's final model on lm-eval ``tasks`` (at most ``max_examples`` documents each): the scores
    per task and metric (``acc``, ``acc_stderr``, ...), also written to ``run_dir/eval-lm-eval.json``."""
    require_lm_eval()
    import lm_eval

    from fedtune.artifacts import load_final
    from fedtune.harness.model import FedtuneLM
    from fedtune.harness.tasks import TASK_PREFIX, builtin_task_names, export_tasks

    ours = builtin_task_names()
    check_tasks([name for name in tasks if name.startswith(TASK_PREFIX)], ours, allow_empty=True)
    final = load_final(run_dir, variant, options)
    model = FedtuneLM(final=final, batch_size=batch_size or final.cfg.eval.batch_size)
    include = export_tasks(run_dir / TASKS_DIR_NAME, final.prompt, tasks)
    manager = task_manager(include, lm_eval_tasks=not set(tasks) <= set(ours))
    check_tasks(tasks, manager.all_tasks)
    try:
        output = lm_eval.simple_evaluate(
            model=model, tasks=list(tasks), task_manager=manager, limit=max_examples, log_samples=False
        )
    except ConnectionError as exc:
        raise HarnessError(
            f"--tasks {','.join(tasks)}: a task's data is not here ({exc}); lm-eval's own tasks need the "
            "hub once (the datasets cache keeps them), fedtune-<set> tasks run offline"
        ) from None
    scores = task_scores(output["results"])
    summary = {
        "harness": "lm-eval",
        "lm_eval_version": lm_eval.__version__,
        "tasks": list(tasks),
        "variant": variant,
        "options": dict(options or {}),
        "max_examples": max_examples,
        "scores": scores,
        "n_samples": output.get("n-samples", {}),
        "versions": output.get("versions", {}),
    }
    (run_dir / RESULTS_FILE).write_text(json.dumps(summary, indent=1, default=str))
    return scores


def task_scores(results: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """lm-eval's ``results`` as ``{task: {metric: value}}``: the filter suffix (``acc,none``) dropped,
    only numbers kept (a stderr lm-eval could not compute is left out)."""
    scores: dict[str, dict[str, float]] = {}
    for task, values in results.items():
        for key, value in values.items():
            if "," in key and isinstance(value, int | float):
                metric, _, where = key.partition(",")
                scores.setdefault(task, {})[metric if where == "none" else f"{metric},{where}"] = float(value)
    return scores
