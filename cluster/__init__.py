"""Start a local cluster (LocalCUDACluster or LocalCluster) or connect to an existing one
(``cluster.lifecycle``), from a pure description of it (``cluster.spec``): ``import cluster.spec``
loads no distributed."""
