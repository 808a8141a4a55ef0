"""fedtune: federated fine-tuning of large language models when clients cannot hold the large model.

From Python: ``fedtune.run(config, **overrides)``, ``fedtune.resume(run_dir)`` and
``fedtune.load(run_dir)`` (the final model, as the run's method defines it); see ``fedtune.api``.
"""

import logging

from fedtune.api import load, resume, run
from fedtune.version import __version__

__all__ = ["__version__", "load", "resume", "run"]

# bitsandbytes (the quant extra) warns at import, on CPUs with AVX512-BF16, that an optional kernel
# fetched from the model hub is missing; fedtune runs offline, and the built-in CPU kernel is used.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
