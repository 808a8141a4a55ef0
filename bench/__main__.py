"""``python -m bench ID [args]``: run the benchmark of that id (``bench/ids.py``) with ``args``.

python -m bench                 # list the ids
python -m bench p3 --smoke      # bench/sft_throughput.py --smoke, writes bench/results/p3.smoke.*
python -m bench p3 --help       # the benchmark's own options
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from bench.ids import BENCHMARKS


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    return "\n".join(
        f"{key.ljust(width)}  bench/{b.script}.py -> bench/results/{b.results}.json: {b.measures}"
        for key, b in BENCHMARKS.items()
    )


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0] + "\n\n" + listing())
        return
    key, *rest = argv
    if key.lower() not in BENCHMARKS:
        raise SystemExit(f"no benchmark {key!r}; the ids are: {', '.join(BENCHMARKS)}")
    benchmark = BENCHMARKS[key.lower()]
    args = [*benchmark.args, *rest]
    script = importlib.import_module(f"bench.{benchmark.script}")
    # The results file records sys.argv as the command that made it: the script's own command line.
    sys.argv = [f"bench/{benchmark.script}.py", *args]
    script.main(args)


if __name__ == "__main__":
    main()
