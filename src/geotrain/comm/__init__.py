"""Communication layer: reducers that average tensors over data-parallel groups."""
