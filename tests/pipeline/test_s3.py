"""s3:// inputs and outputs against a real S3-compatible server (moto) on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply, verify_product
from tests.helpers import assert_product, random_matrix

pytest.importorskip("s3fs")


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    """A moto S3 server on a free loopback port, with one bucket; stopped afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "test", "secret": "test"}
    try:
        import s3fs

        deadline = time.monotonic() + 30
        while True:
            try:
                fs = s3fs.S3FileSystem(**options)
                fs.mkdir("bucket")
                break
            except Exception:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        yield options
    finally:
        server.terminate()
        server.wait(timeout=10)


def put(url: str, data: np.ndarray, chunks: tuple[int, int], options: dict[str, Any]) -> str:
    zarr.create_array(url, data=data, chunks=chunks, storage_options=options)
    return url


def test_multiply_verify_resume_on_s3(s3: dict[str, Any], client: Client) -> None:
    rng = np.random.default_rng(11)
    a, b = random_matrix(rng, (70, 45), "float32"), random_matrix(rng, (45, 52), "float64")
    a_url = put("s3://bucket/t1/a.zarr", a, (20, 16), s3)
    b_url = put("s3://bucket/t1/b.zarr", b, (15, 25), s3)
    out = "s3://bucket/t1/c.zarr"
    first = multiply(a_url, b_url, out, client=client, storage_options=s3, verify=True)
    assert first.verified is True
    assert_product(zarr.open_array(out, mode="r", storage_options=s3)[:], a, b)
    resumed = multiply(a_url, b_url, out, client=client, storage_options=s3, resume=True)
    assert resumed.tiles_skipped == first.plan.n_tiles and resumed.tiles_computed == 0
    assert verify_product(client, a_url, b_url, out, s3).passed


def test_cli_on_s3(s3: dict[str, Any], tmp_path: Any) -> None:
    options = [f"--storage-option={k}={v}" for k, v in s3.items()]
    run = [sys.executable, "-m", "pipeline"]
    common = ["--dashboard-address", "127.0.0.1:0", *options]
    for name, shape, chunks in (("a", "40x30", "16x7"), ("b", "30x20", "9x20")):
        subprocess.run([*run, "random", f"s3://bucket/t2/{name}.zarr", "--shape", shape,
                        "--chunks", chunks, *options], check=True)  # fmt: skip
    urls = [f"s3://bucket/t2/{x}.zarr" for x in "abc"]
    done = subprocess.run([*run, "multiply", *urls, "--no-progress", *common],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    check = subprocess.run([*run, "verify", *urls, *common], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    a = zarr.open_array(urls[0], mode="r", storage_options=s3)[:]
    b = zarr.open_array(urls[1], mode="r", storage_options=s3)[:]
    assert_product(zarr.open_array(urls[2], mode="r", storage_options=s3)[:], a, b)


def test_arrays_opened_on_s3_bring_their_options(s3: dict[str, Any], client: Client) -> None:
    """zarr.Array objects as A and B: their file system's options reach the workers (and OUT)
    without storage_options=."""
    rng = np.random.default_rng(12)
    a, b = random_matrix(rng, (33, 21), "float32"), random_matrix(rng, (21, 17), "float32")
    a_array = zarr.open_array(
        put("s3://bucket/t3/a.zarr", a, (10, 7), s3), mode="r", storage_options=s3
    )
    b_array = zarr.open_array(
        put("s3://bucket/t3/b.zarr", b, (7, 10), s3), mode="r", storage_options=s3
    )
    out = "s3://bucket/t3/c.zarr"
    multiply(a_array, b_array, out, client=client)
    assert_product(zarr.open_array(out, mode="r", storage_options=s3)[:], a, b)


def test_lock_on_s3_is_a_conditional_create(s3: dict[str, Any]) -> None:
    """Two holders can't both create lock.json (If-None-Match); another host's lock is refused
    with the key to delete; a dead local holder's is taken over."""
    import json
    import socket

    import s3fs

    from pipeline.errors import UnsafeOutputError
    from pipeline.store import lock

    url = "s3://bucket/locked.zarr"
    first = lock.acquire(url, s3)
    with pytest.raises(UnsafeOutputError, match=r"being written by another job \(pid"):
        lock.acquire(url, s3)
    first.release()
    fs = s3fs.S3FileSystem(**s3)
    assert not fs.exists("bucket/locked.zarr/lock.json")
    other = {"pid": 1, "host": "elsewhere", "started": time.time(), "token": "x"}
    fs.pipe_file("bucket/locked.zarr/lock.json", json.dumps(other).encode())
    with pytest.raises(UnsafeOutputError, match=r"another host.*delete s3://bucket/locked.zarr/"):
        lock.acquire(url, s3)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = {**other, "pid": dead.pid, "host": socket.gethostname(), "process_started": 0}
    fs.pipe_file("bucket/locked.zarr/lock.json", json.dumps(gone).encode())
    held = lock.acquire(url, s3)
    assert held.still_held()
    held.release()


def test_accumulate_on_s3(s3: dict[str, Any], client: Client) -> None:
    rng = np.random.default_rng(12)
    a, b = random_matrix(rng, (40, 30), "float64"), random_matrix(rng, (30, 20), "float64")
    c0 = random_matrix(rng, (40, 20), "float64")
    a_url = put("s3://bucket/acc/a.zarr", a, (20, 15), s3)
    b_url = put("s3://bucket/acc/b.zarr", b, (15, 10), s3)
    c_url = put("s3://bucket/acc/c.zarr", c0, (20, 10), s3)
    multiply(a_url, b_url, c_url, client=client, storage_options=s3, accumulate=True, beta=2)
    got = zarr.open_array(c_url, mode="r", storage_options=s3)[:]
    np.testing.assert_allclose(got, a @ b + 2 * c0, rtol=1e-12, atol=1e-12)
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    assert not fs.exists("bucket/acc/c.zarr/.tilegemm-accumulate"), "cleaned up"
    assert not fs.exists("bucket/acc/c.zarr/lock.json")


def test_a_refused_accumulation_on_s3_puts_c_back(s3: dict[str, Any], client: Client) -> None:
    """An object store has no rename: the originals are copied aside and deleted, and copied
    home again when a tile's sum leaves an int16 C's range; C's objects as they were."""
    import s3fs

    from pipeline.errors import InputError

    fs = s3fs.S3FileSystem(**s3)
    a_url = put("s3://bucket/back/a.zarr", np.ones((40, 3), bool), (20, 3), s3)
    b_url = put("s3://bucket/back/b.zarr", np.ones((3, 20), bool), (3, 10), s3)
    c0 = np.zeros((40, 20), "int16")
    c0[-1, -1] = 32767
    c_url = put("s3://bucket/back/c.zarr", c0, (20, 10), s3)
    before = {p: fs.cat_file(p) for p in fs.find("bucket/back/c.zarr")}
    with pytest.raises(InputError, match="beyond C's int16 range"):
        multiply(a_url, b_url, c_url, client=client, storage_options=s3, accumulate=True)
    fs.invalidate_cache()
    after = {p: fs.cat_file(p) for p in fs.find("bucket/back/c.zarr")}
    assert after == before
