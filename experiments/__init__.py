"""The paper-table sweeps: one script per paper, on the shared table machine ``experiments/tables/``
(plots: ``experiments/plots.py``)."""
