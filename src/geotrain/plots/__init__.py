"""Figures (matplotlib, Agg backend): written to files, never shown."""

from geotrain.plots.compression import plot_bpc_vs_traffic
from geotrain.plots.placement import plot_placement

__all__ = ["plot_bpc_vs_traffic", "plot_placement"]
