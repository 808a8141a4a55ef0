"""fedtune's performance benchmarks: ``bench/ids.py`` names them, ``python -m bench ID`` runs one."""
