"""A real LocalCUDACluster on a machine without a GPU, through dask-cuda's MockWorker.

The workers inherit NUMBA_ENABLE_CUDASIM=1 (set in conftest) and run the Numba CUDA kernels
in the simulator, so this is the multi-GPU path of CI: one worker per "GPU", each tile task
on some worker's device, tiles spread over both workers.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client, get_task_stream

from cluster.spec import ClusterSpec, local_cluster_options
from pipeline import multiply
from pipeline.errors import InputError
from tests.helpers import assert_product, random_matrix, write_array

pytest.importorskip("dask_cuda")
pytest.importorskip("kernels.cuda.host")

TILE_TASK_PREFIXES = ("matmul-tile-", "matmul-partial-")
"""Keys of the tasks that run a block product (whole tiles, or split-K groups)."""


@pytest.fixture(scope="module")
def cuda_client() -> Iterator[Client]:
    from dask_cuda import LocalCUDACluster
    from dask_cuda.utils_test import MockWorker

    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "conftest must switch the simulator on"
    with warnings.catch_warnings():
        # no NVML here: dask-cuda warns that it cannot pin workers to the mock devices' CPUs
        warnings.filterwarnings("ignore", "Cannot get CPU affinity", UserWarning)
        # as cluster.start configures it (loopback, temporary TLS), on two mock devices
        spec = ClusterSpec(workers=2, dashboard_address="127.0.0.1:0")
        kind, options = local_cluster_options(spec, gpus=2, cpus=2, memory_limit=2 * 2**30)
        assert kind == "cuda"
        assert options["data"] is dict and options["device_memory_limit"] == 0
        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,1", worker_class=MockWorker, **options)
    with cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        assert client.scheduler.address.startswith("tls://127.0.0.1:")
        yield client


def _count_calls(method: str) -> None:
    """Run on each worker: count the calls of ``NumbaDevice.<method>`` (gemm: the staged
    engine's kernel launches), or of ``PanelDecoder.decode_into`` (panels decoded on the
    device)."""
    owner = _owner(method)
    original = getattr(owner, method)
    original = getattr(original, "__wrapped__", original)

    @functools.wraps(original)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted.calls += 1  # type: ignore[attr-defined]
        return original(self, *args, **kwargs)

    counted.calls = 0  # type: ignore[attr-defined]
    setattr(owner, method, counted)


def _calls_counted(method: str) -> int:
    return int(getattr(getattr(_owner(method), method), "calls", 0))


def _owner(method: str) -> Any:
    from kernels.device.decode import PanelDecoder
    from kernels.device.gpu import NumbaDevice

    return PanelDecoder if method == "decode_into" else NumbaDevice


# Pickled by value: the workers need not import this test module (nor pytest).
_count_calls.__module__ = _calls_counted.__module__ = "__main__"


@pytest.fixture(scope="module")
def operands(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, str, str]:
    """A 40x24 @ 24x30 float32 product, ragged against the kernel tiles and the chunks."""
    root = tmp_path_factory.mktemp("cuda-inputs")
    rng = np.random.default_rng(7)
    a, b = random_matrix(rng, (40, 24), "float32"), random_matrix(rng, (24, 30), "float32")
    return (
        a,
        b,
        write_array(root / "a.zarr", a, (20, 10)),
        write_array(root / "b.zarr", b, (12, 15)),
    )


def test_workers_see_two_devices_and_the_simulator(cuda_client: Client) -> None:
    env = cuda_client.run(
        lambda: (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("NUMBA_ENABLE_CUDASIM"))
    )
    assert len(env) == 2
    # dask-cuda rotates the device list: each worker's first device is a different "GPU"
    assert sorted(devices for devices, _ in env.values()) == ["0,1", "1,0"]
    assert {sim for _, sim in env.values()} == {"1"}


def test_cuda_backend_runs_tiles_on_both_workers(
    cuda_client: Client, operands: tuple[Any, Any, str, str], tmp_path: Path
) -> None:
    a, b, a_url, b_url = operands
    out = str(tmp_path / "c.zarr")
    cuda_client.run(_count_calls, "gemm")
    with get_task_stream(cuda_client) as stream:
        result = multiply(a_url, b_url, out, client=cuda_client, backend="cuda")
    assert result.backend == "cuda"
    assert result.plan.n_tiles * result.plan.split_k >= 2, "need >= 2 product tasks to spread"
    assert_product(zarr.open_array(out, mode="r")[:], a, b)
    workers = {
        event["worker"] for event in stream.data if str(event["key"]).startswith(TILE_TASK_PREFIXES)
    }
    assert workers == set(cuda_client.scheduler_info()["workers"]), workers
    # the products ran through the staged engine's CUDA kernel (simulated) on every worker
    products = cuda_client.run(_calls_counted, "gemm")
    assert all(n >= 1 for n in products.values()), products


def test_auto_backend_picks_cpu_on_the_simulator(
    cuda_client: Client, operands: tuple[Any, Any, str, str], tmp_path: Path
) -> None:
    a, b, a_url, b_url = operands
    out = str(tmp_path / "c.zarr")
    result = multiply(a_url, b_url, out, client=cuda_client, backend="auto")
    assert result.backend == "cpu"  # the simulator is not a GPU
    assert_product(zarr.open_array(out, mode="r")[:], a, b)


def test_gpu_decode_gives_the_same_bytes(cuda_client: Client, tmp_path: Path) -> None:
    """--gpu-decode: zstd chunks staged compressed and decoded on the (simulated) device give
    OUT bitwise equal to panels decoded on the host. Whole numbers compress, so every frame
    fits in its panel's staging buffer, edge chunks too."""
    rng = np.random.default_rng(11)
    a = np.round(random_matrix(rng, (40, 24), "float32") * 50)
    b = np.round(random_matrix(rng, (24, 30), "float32") * 50)
    a_url = write_array(tmp_path / "a.zarr", a, (16, 12))  # zarr's default codec: zstd
    b_url = write_array(tmp_path / "b.zarr", b, (12, 16))
    outs = [str(tmp_path / "host.zarr"), str(tmp_path / "device.zarr")]
    multiply(a_url, b_url, outs[0], client=cuda_client, backend="cuda")
    cuda_client.run(_count_calls, "decode_into")
    result = multiply(a_url, b_url, outs[1], client=cuda_client, backend="cuda", gpu_decode=True)
    panels = result.plan.n_tiles * len(result.plan.k_panels)  # each tile's, over its tasks
    assert sum(cuda_client.run(_calls_counted, "decode_into").values()) == 2 * panels  # A and B
    assert result.phases["decode"] == 0.0 and result.phases["read"] > 0.0
    host, device = (zarr.open_array(out, mode="r")[:] for out in outs)
    assert device.tobytes() == host.tobytes()
    assert_product(device, a, b)


def test_gpu_decode_names_a_corrupt_chunk(cuda_client: Client, tmp_path: Path) -> None:
    """A chunk that fails to decode on the device is named as the host path names it."""
    rng = np.random.default_rng(12)
    a = np.round(random_matrix(rng, (40, 24), "float32") * 50)
    b = np.round(random_matrix(rng, (24, 30), "float32") * 50)
    a_url = write_array(tmp_path / "a.zarr", a, (16, 12))
    b_url = write_array(tmp_path / "b.zarr", b, (12, 16))
    chunk = tmp_path / "a.zarr" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-9] + b"corrupted")
    with pytest.raises(
        InputError, match=r"A \(.*a\.zarr\) has a chunk that cannot be read: .*c/1/0"
    ):
        multiply(a_url, b_url, str(tmp_path / "c.zarr"), client=cuda_client, backend="cuda",
                 gpu_decode=True)  # fmt: skip


def test_cuda_backend_accumulates_into_a_sharded_c(
    cuda_client: Client, operands: tuple[Any, Any, str, str], tmp_path: Path
) -> None:
    """--accumulate on the staged CUDA path (simulated): the bands the engine hands back are
    combined with C's saved originals on the host; C sharded, the originals by shard."""
    a, b, a_url, b_url = operands
    c0 = np.arange(40 * 30, dtype="float32").reshape(40, 30) / 100
    c_url = str(tmp_path / "c.zarr")
    zarr.create_array(c_url, data=c0, chunks=(10, 15), shards=(20, 30))
    result = multiply(a_url, b_url, c_url, client=cuda_client, backend="cuda",
                      accumulate=True, alpha=-1.0, beta=3.0)  # fmt: skip
    assert result.backend == "cuda"
    want = -(a.astype(np.float64) @ b.astype(np.float64)) + 3 * c0
    np.testing.assert_allclose(zarr.open_array(c_url, mode="r")[:], want, rtol=1e-5, atol=1e-4)


def _memory_settings(dask_worker: Any) -> tuple[Any, Any, Any, str]:
    manager = dask_worker.memory_manager
    return (
        manager.memory_pause_fraction,
        manager.memory_spill_fraction,
        manager.memory_target_fraction,
        type(dask_worker.data).__name__,
    )


def test_the_gpu_cluster_we_start_neither_pauses_nor_spills(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cluster.start's LocalCUDACluster (two mock GPUs): no pause, no spill, a plain dict
    store instead of dask-cuda's spilling one, like the CPU cluster."""
    import dask_cuda
    from dask_cuda.utils_test import MockWorker

    from cluster import lifecycle
    from cluster.lifecycle import start

    real = dask_cuda.LocalCUDACluster
    mock = functools.partial(real, CUDA_VISIBLE_DEVICES="0,1", worker_class=MockWorker)
    monkeypatch.setattr(dask_cuda, "LocalCUDACluster", mock)
    monkeypatch.setattr(lifecycle, "count_gpus", lambda: 2)
    spec = ClusterSpec(workers=2, dashboard_address="127.0.0.1:0")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Cannot get CPU affinity", UserWarning)
        with start(spec, 2**30) as client:
            client.wait_for_workers(2, timeout=60)
            settings = set(client.run(_memory_settings).values())
    assert settings == {(False, False, False, "dict")}
