"""The paper-table sweeps: one script per paper, on the shared machinery of ``experiments/sweep.py``."""
