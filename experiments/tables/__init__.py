"""The table machine every paper-table script stands on: a script holds its rows (name -> config
overrides), what it reads off a finished run, its claims (the paper's orderings) and its table's columns;
this package does the rest, one module a concern:

- `runs`: rows and seeds (`plan`; each row at its own lr: `row_lr_option`, `row_lrs`, `at_own_lr`,
  `run_lr`), running (`start`, `run`), reading a finished run (`finished_rows`, `finals`);
- `aggregate`: values over seeds (`over_seeds`, `seed_values`) and their cells (`cell`);
- `verdicts`: claims (`check`, `verdict`, `on_common_seeds`; `paired_interval`, a claim's paired t
  interval and its verdict; `claim_text`, the intervals of a claim's adjacent rows as the
  line stating it reads them);
- `keep`: keeping earlier results (`fill_seeds`, the one way a seed is kept; `keep_earlier_rows`;
  `refuse_lr_mix`, which refuses seeds measured at another lr; `write_table`, which refuses to drop a
  recorded value);
- `notes`: what closes a table's .md (`closing_notes`: what was kept, the replies servers rejected);
- `render`: ``--render RESULTS_JSON`` rewrites a table's ``.md`` from its ``.json`` alone;
- `layout`: a table's markdown columns, declared (`layout.Column`, `layout.table`).

Plots: `experiments.plots`. A script imports the package (``from experiments import tables``) and reaches
all but two modules through it, as ``tables.<name>``; those two it imports as modules (``from
experiments.tables import layout, search``): `layout` and `search`, a table's lr search on validation.
"""

from bench.common import command_line, markdown_table, sibling

from experiments.tables.aggregate import (
    FEWER_SEEDS_NOTE,
    cell,
    fewer_seeds,
    mean_std,
    over_seeds,
    plus_minus,
    seed_values,
    seeds_text,
)
from experiments.tables.keep import (
    carried_seeds,
    dropped_values,
    earlier_results,
    fill_cells,
    fill_seeds,
    keep_earlier_rows,
    keep_earlier_seeds,
    refuse_lr_mix,
    seed_slice,
    write_table,
)
from experiments.tables.notes import (
    REJECTED_HEAD,
    closing_notes,
    earlier_rejections,
    kept_rows_note,
    kept_seeds_note,
    rejected_note,
    rejected_replies,
    run_notes,
)
from experiments.tables.render import (
    Recorded,
    Renderer,
    command_args,
    recorded_command,
    render,
    stamp_of,
    write_rendered,
)
from experiments.tables.runs import (
    RESULTS_DIR,
    Plan,
    asked_lr,
    at_own_lr,
    finals,
    finished_rows,
    last_evaluated,
    load_config,
    lr_override,
    lr_stem,
    parse_args,
    per_round_mb,
    plan,
    read_rows,
    row_lr_option,
    row_lrs,
    run,
    run_all,
    run_lr,
    run_name_parts,
    runs_lr,
    seed_dirs,
    seed_of,
    start,
    table_parser,
    train_lr,
    trained_rows,
)
from experiments.tables.verdicts import (
    Interval,
    Verdict,
    check,
    claim_text,
    common_seeds,
    interval_texts,
    on_common_seeds,
    paired_interval,
    rises,
    seeds_holding,
    verdict,
)

__all__ = [
    "FEWER_SEEDS_NOTE",
    "REJECTED_HEAD",
    "RESULTS_DIR",
    "Interval",
    "Plan",
    "Recorded",
    "Renderer",
    "Verdict",
    "asked_lr",
    "at_own_lr",
    "carried_seeds",
    "cell",
    "check",
    "claim_text",
    "closing_notes",
    "command_args",
    "command_line",
    "common_seeds",
    "dropped_values",
    "earlier_rejections",
    "earlier_results",
    "fewer_seeds",
    "fill_cells",
    "fill_seeds",
    "finals",
    "finished_rows",
    "interval_texts",
    "keep_earlier_rows",
    "keep_earlier_seeds",
    "kept_rows_note",
    "kept_seeds_note",
    "last_evaluated",
    "load_config",
    "lr_override",
    "lr_stem",
    "markdown_table",
    "mean_std",
    "on_common_seeds",
    "over_seeds",
    "paired_interval",
    "parse_args",
    "per_round_mb",
    "plan",
    "plus_minus",
    "read_rows",
    "recorded_command",
    "refuse_lr_mix",
    "rejected_note",
    "rejected_replies",
    "render",
    "rises",
    "row_lr_option",
    "row_lrs",
    "run",
    "run_all",
    "run_lr",
    "run_name_parts",
    "run_notes",
    "runs_lr",
    "seed_dirs",
    "seed_of",
    "seed_slice",
    "seed_values",
    "seeds_holding",
    "seeds_text",
    "sibling",
    "stamp_of",
    "start",
    "table_parser",
    "train_lr",
    "trained_rows",
    "verdict",
    "write_rendered",
    "write_table",
]
