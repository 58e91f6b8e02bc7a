"""geotrain: plan and run foundation-model training across slow, heterogeneous, geo-distributed networks."""

__version__ = "0.1.0"
