"""fedtune: federated fine-tuning of large language models when clients cannot hold the large model.

From Python: ``fedtune.run(config, **overrides)``, ``fedtune.resume(run_dir)`` and
``fedtune.load(run_dir)`` (the final model, as the run's method defines it); see ``fedtune.api``.
"""

from fedtune.api import load, resume, run
from fedtune.version import __version__

__all__ = ["__version__", "load", "resume", "run"]
