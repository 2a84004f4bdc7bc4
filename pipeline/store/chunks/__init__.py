"""The fast chunk readers: stored chunks read and decoded into exactly their size, without zarr's
per-chunk machinery (``unsharded``, ``sharded``), or kept compressed for the GPU (``raw``)."""
