"""The `geotrain` command line."""
