"""Start a local cluster (LocalCUDACluster or LocalCluster) or connect to an existing one."""

from cluster.spec import ClusterSpec, local_cluster_options
from cluster.start import connect, count_gpus, start

__all__ = ["ClusterSpec", "connect", "count_gpus", "local_cluster_options", "start"]
