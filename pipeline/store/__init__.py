"""Store: the inputs (read-only) and the output (one owner), over fsspec and Zarr."""
