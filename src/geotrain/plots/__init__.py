"""Figures (matplotlib, Agg backend): written to files, never shown."""

from geotrain.plots.placement import plot_placement

__all__ = ["plot_placement"]
