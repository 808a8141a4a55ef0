"""fedtune's built-in test sets as lm-evaluation-harness tasks, offline.

Each set has a task YAML in ``lm_eval_tasks/`` (``fedtune-<set>``, ``dataset_path: json``).
``export_tasks`` writes a set's test split as a json file with every record's prompt as a run's final
model reads it (its template and tokenizer: the harness sees what fedtune's own evaluation sees), and
the YAMLs pointing at those files, into one directory: lm-eval's ``TaskManager(include_path=...)`` (or
``lm_eval --include_path``) then runs them without a hub. Multiple-choice sets score each choice's
log-likelihood (``acc``, ``acc_norm``); a classification set becomes multiple choice over its class
names; generation sets are scored with fedtune's ROUGE-L, exact match and numeric accuracy
(``lm_eval_tasks/utils.py``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedtune.data.builtin import builtin_info, load_builtin
from fedtune.data.records import Record

TASKS_DIR = Path(__file__).parent / "lm_eval_tasks"
TASK_PREFIX = "fedtune-"
DATA_PLACEHOLDER = "@DATA_DIR@"
SPLIT = "test"


def builtin_task_names() -> list[str]:
    """The lm-eval task names of fedtune's built-in sets (``fedtune-<set>``)."""
    return sorted(path.stem for path in TASKS_DIR.glob(f"{TASK_PREFIX}*.yaml"))


def task_row(record: Record, prompt: str, class_names: tuple[str, ...] | None) -> dict[str, Any]:
    """One json row: the prompt, the reference and, for a choice task, the choices and the answer's
    index (a classification record's choices are the set's class names)."""
    row: dict[str, Any] = {
        "id": record.id,
        "prompt": prompt,
        "output": record.output,
        "category": record.category,
    }
    if record.is_multiple_choice:
        row.update(choices=list(record.choices), label=record.label)
    elif class_names is not None:
        row.update(choices=list(class_names), label=class_names.index(record.output))
    return row


def export_tasks(
    directory: Path, prompt: Callable[[Record], str], tasks: Sequence[str] | None = None
) -> Path:
    """The built-in sets' test splits (each record's ``prompt``: e.g. ``FinalModel.prompt``, the run's
    template) and their task YAMLs in ``directory`` (made or refreshed), with ``utils.py`` beside them:
    those of ``tasks`` (``fedtune-<set>`` names; others are skipped), or all. Returns ``directory``."""
    data_dir = directory / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    ours = builtin_task_names()
    for task in ours if tasks is None else [name for name in ours if name in tasks]:
        name = task[len(TASK_PREFIX) :]
        info = builtin_info(name)
        class_names = info.categories if info.task == "classification" else None
        rows = [task_row(record, prompt(record), class_names) for record in load_builtin(name, SPLIT)]
        (data_dir / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        text = (TASKS_DIR / f"{task}.yaml").read_text()
        (directory / f"{task}.yaml").write_text(text.replace(DATA_PLACEHOLDER, str(data_dir.resolve())))
    shutil.copyfile(TASKS_DIR / "utils.py", directory / "utils.py")
    return directory
