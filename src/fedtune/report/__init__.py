"""Tables and plots from run directories (``fedtune report``, ``fedtune data stats``)."""

from fedtune.report.io import ReportError, read_config, read_data_stats, read_metrics
from fedtune.report.plots import plot_partition
from fedtune.report.report import write_report
from fedtune.report.tables import markdown_table, partition_table

__all__ = [
    "ReportError",
    "markdown_table",
    "partition_table",
    "plot_partition",
    "read_config",
    "read_data_stats",
    "read_metrics",
    "write_report",
]
