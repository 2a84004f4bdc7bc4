"""``C ← α·A·B + β·C`` exactly once: fresh, after a failure mid-tile (C half-written, or
written but not journaled), after kill -9 of the whole job (real processes) and with a worker
killed mid-job; refusals before any work."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline import multiply
from pipeline.accumulate.state import SIDECAR
from pipeline.errors import InputError, IntegerOverflowError, UsageError
from tests.helpers import random_matrix, run_cli, write_array
from tests.pipeline.test_crash import job, multiply_argv

ALPHA, BETA = 2.0, -0.5


def setup(tmp_path: Path, m: int = 600, k: int = 96, n: int = 520, c_chunks: Any = (256, 256),
          dtype: str = "float64") -> tuple[str, str, str, np.ndarray]:  # fmt: skip
    """A, B and an existing C of someone else's (plain zarr, no attributes of ours)."""
    rng = np.random.default_rng(4)
    a, b = random_matrix(rng, (m, k), "float32"), random_matrix(rng, (k, n), "float32")
    c0 = random_matrix(rng, (m, n), dtype)
    a_url = write_array(tmp_path / "a.zarr", a, (200, 32))
    b_url = write_array(tmp_path / "b.zarr", b, (32, 260))
    c_url = str(tmp_path / "c.zarr")
    zarr.create_array(c_url, data=c0, chunks=c_chunks, attributes={"owner": "someone else"})
    return a_url, b_url, c_url, c0


def expected(a_url: str, b_url: str, c0: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    a = np.asarray(zarr.open_array(a_url)[:], dtype=np.float64)
    b = np.asarray(zarr.open_array(b_url)[:], dtype=np.float64)
    return alpha * (a @ b) + beta * c0


def assert_once(c_url: str, want: np.ndarray) -> None:
    """C holds α·A·B + β·C_old to float64 rounding: a product added twice (or C_old taken
    from a half-updated C) is off by a whole product."""
    got = np.asarray(zarr.open_array(c_url, mode="r")[:])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert zarr.open_array(c_url).attrs.asdict() == {"owner": "someone else"}
    assert not (Path(c_url) / SIDECAR).exists(), "the accumulation's state is cleaned up"


def test_accumulate_into_someone_elses_array(tmp_path: Path, client: Client) -> None:
    a_url, b_url, c_url, c0 = setup(tmp_path)
    before = sorted(p.name for p in Path(c_url).iterdir())
    result = multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=ALPHA,
                      beta=BETA)  # fmt: skip
    assert result.tiles_computed == result.plan.n_tiles > 1
    assert_once(c_url, expected(a_url, b_url, c0, ALPHA, BETA))
    assert sorted(p.name for p in Path(c_url).iterdir()) == before, "nothing of ours left"
    # A second accumulation is a new one: the product is added again, on purpose.
    multiply(a_url, b_url, c_url, client=client, accumulate=True)
    assert_once(c_url, expected(a_url, b_url, expected(a_url, b_url, c0, ALPHA, BETA), 1, 1))


def test_alpha_scales_a_fresh_product(tmp_path: Path, client: Client) -> None:
    a_url, b_url, _, _ = setup(tmp_path)
    out = tmp_path / "fresh.zarr"
    multiply(a_url, b_url, str(out), client=client, alpha=-3.0)
    want = expected(a_url, b_url, np.zeros((600, 520)), -3.0, 0)
    np.testing.assert_allclose(zarr.open_array(str(out))[:], want, rtol=2e-5, atol=1e-3)


@pytest.mark.parametrize(
    "fail_at",
    [
        # the task dies after writing its tile into C, before journaling it
        "journal",
        # the task dies before writing anything (its original copy is saved)
        "write",
    ],
)
def test_a_failed_accumulation_puts_c_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: str
) -> None:
    """Tiles fail after others were written: C is rolled back to its old values (bit for bit,
    the folder gone), and the next --accumulate adds each product once."""
    import pipeline.accumulate.tasks as acc
    import pipeline.run.worker as worker

    a_url, b_url, c_url, c0 = setup(tmp_path)
    before = stored(Path(c_url))
    tiles: dict[Any, int] = {}

    def tile_of(args: tuple[Any, ...]) -> Any:
        if fail_at == "journal":
            return args[1]  # _journal(spec, tile, ...)
        # combine(spec, partial, C_old's band) runs per band in the tile's own band-writer
        # thread (a pool per task): the thread object, kept here, names the tile
        return threading.current_thread()

    def failing(real: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if tiles.setdefault(tile_of(args), len(tiles)) % 2 == 1:  # every other tile fails
                raise RuntimeError("simulated crash")  # (whatever its bands or the tiling)
            return real(*args, **kwargs)

        return wrapped

    target = (worker, "_journal") if fail_at == "journal" else (acc, "combine")
    monkeypatch.setattr(*target, failing(getattr(*target)))
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c:  # fmt: skip
        with pytest.raises(Exception, match="simulated crash.* C is put back as it was .* "
                           "without resume=True"):  # fmt: skip
            multiply(a_url, b_url, c_url, client=c, accumulate=True, alpha=ALPHA, beta=BETA)
        assert min(tiles.values(), default=0) == 0 and len(tiles) > 1, "some tiles were written"
        assert stored(Path(c_url)) == before, "C's stored objects are back, bit for bit"
        assert not (Path(c_url) / SIDECAR).exists()
        monkeypatch.undo()
        with pytest.raises(UsageError, match="no unfinished accumulation"):
            multiply(a_url, b_url, c_url, client=c, accumulate=True, resume=True,
                     alpha=ALPHA, beta=BETA)  # fmt: skip
        result = multiply(a_url, b_url, c_url, client=c, accumulate=True, alpha=ALPHA, beta=BETA)
    assert result.tiles_skipped == 0 and result.tiles_computed > 0
    assert_once(c_url, expected(a_url, b_url, c0, ALPHA, BETA))


def stored(folder: Path) -> dict[str, bytes]:
    """C's files (its metadata and stored objects) by name, the accumulation's folder aside."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and SIDECAR not in p.parts
    }


def test_kill_9_of_the_whole_job_then_resume(tmp_path: Path) -> None:
    """Real processes: the CLI killed (SIGKILL to its process group) while tiles are in
    flight, twice, then resumed: every product added once."""
    a_url, b_url, c_url, c0 = setup(tmp_path, m=2048, k=512, n=2048, c_chunks=(256, 256))
    argv = multiply_argv(a_url, b_url, Path(c_url), "--accumulate", "--alpha", str(ALPHA),
                         "--beta", str(BETA), "--memory-limit", "300MiB")  # fmt: skip
    saved = Path(c_url) / SIDECAR / "saved"
    for attempt, at in enumerate((3, 10)):
        args = argv + (["--resume"] if attempt else [])
        with job(args, tmp_path / f"killed{attempt}") as proc:
            deadline = time.monotonic() + 240
            while len(list(saved.glob("*.json"))) < at:
                assert proc.poll() is None, (tmp_path / f"killed{attempt}.err").read_text()
                assert time.monotonic() < deadline
                time.sleep(0.003)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    done = run_cli(*argv[3:], "--resume", timeout=240)
    assert done.returncode == 0, done.stderr
    assert_once(c_url, expected(a_url, b_url, c0, ALPHA, BETA))


def test_killed_worker_mid_accumulation(tmp_path: Path) -> None:
    """A worker process SIGKILLed mid-job: distributed reruns its tiles, which take C_old
    from the saved originals, never from the half-updated C."""
    a_url, b_url, c_url, c0 = setup(tmp_path, m=2048, k=1024, n=2048, c_chunks=(256, 256))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", memory_limit="2GiB") as cluster, \
            Client(cluster) as client:  # fmt: skip
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = multiply(a_url, b_url, c_url, client=client, accumulate=True,
                                         alpha=ALPHA, beta=BETA, memory_limit="300MiB")  # fmt: skip
            except BaseException as e:  # noqa: BLE001 - checked below
                box["error"] = e

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        saved = Path(c_url) / SIDECAR / "saved"
        deadline = time.monotonic() + 180
        while len(list(saved.glob("*.json"))) < 4:
            assert thread.is_alive() and time.monotonic() < deadline, box
            time.sleep(0.003)
        busy = [w for w, keys in client.processing().items() if keys]
        pid = client.run(os.getpid, workers=busy[:1])[busy[0]]
        os.kill(pid, signal.SIGKILL)
        thread.join(timeout=180)
    assert "error" not in box, box.get("error")
    assert_once(c_url, expected(a_url, b_url, c0, ALPHA, BETA))


@pytest.mark.parametrize(
    "flags, error, match",
    [
        # C must exist
        ({"out": "missing.zarr"}, InputError, "does not exist"),
        # and have the product's shape
        ({"shape": (600, 521)}, InputError, r"is 600x521, but A @ B is 600x520"),
        # a float product can't go into an integer C
        ({"dtype": "int32"}, UsageError, "truncate"),
        # --overwrite would replace C's values
        ({"overwrite": True}, UsageError, "pick one"),
        # C's layout is kept
        ({"chunks": (100, 100)}, UsageError, "drop chunks"),
        # nothing to resume
        ({"resume": True}, UsageError, "no unfinished accumulation"),
    ],
)
def test_refusals(tmp_path: Path, flags: dict[str, Any], error: type, match: str) -> None:
    a_url, b_url, c_url, _ = setup(tmp_path)
    if "shape" in flags:
        zarr.create_array(c_url, shape=flags.pop("shape"), dtype="f8", overwrite=True)
    if "dtype" in flags:
        zarr.create_array(c_url, shape=(600, 520), dtype=flags.pop("dtype"), overwrite=True)
    out = str(tmp_path / flags.pop("out")) if "out" in flags else c_url
    from pipeline import prepare

    with pytest.raises(error, match=match):
        job_ = prepare(a_url, b_url, out, accumulate=True, **flags)
        job_.execute(None)


def test_beta_needs_accumulate_and_integer_c_takes_whole_factors(tmp_path: Path) -> None:
    from pipeline import prepare

    a_url, b_url, c_url, _ = setup(tmp_path)
    with pytest.raises(UsageError, match="beta .* needs accumulate=True"):
        prepare(a_url, b_url, str(tmp_path / "new.zarr"), beta=2.0)
    ints = write_array(tmp_path / "i.zarr", np.ones((4, 4), "int8"), (2, 2))
    c_int = str(tmp_path / "ci.zarr")
    zarr.create_array(c_int, data=np.zeros((4, 4), "int16"), chunks=(2, 2))
    with pytest.raises(UsageError, match="alpha=0.5 is not a whole number"):
        prepare(ints, ints, c_int, accumulate=True, alpha=0.5)
    with pytest.raises(IntegerOverflowError, match="integer overflow"):
        prepare(ints, ints, c_int, accumulate=True, alpha=2**12)


def test_integer_accumulation_is_exact_and_checked(tmp_path: Path, client: Client) -> None:
    ints = write_array(tmp_path / "i.zarr", np.arange(16, dtype="int8").reshape(4, 4), (2, 2))
    c_int = str(tmp_path / "ci.zarr")
    c0 = np.arange(16, dtype="int32").reshape(4, 4) * 1000
    zarr.create_array(c_int, data=c0, chunks=(2, 2))
    multiply(ints, ints, c_int, client=client, accumulate=True, alpha=3, beta=-2)
    a = np.arange(16, dtype=np.int64).reshape(4, 4)
    np.testing.assert_array_equal(zarr.open_array(c_int)[:], 3 * (a @ a) - 2 * c0)


def test_cli_accumulate(tmp_path: Path) -> None:
    a_url, b_url, c_url, c0 = setup(tmp_path)
    done = run_cli("multiply", a_url, b_url, c_url, "--accumulate", "--alpha", "2",
                   "--beta", "-0.5", "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_once(c_url, expected(a_url, b_url, c0, 2, -0.5))
    bad = run_cli("multiply", a_url, b_url, c_url, "--beta", "2", "--no-progress")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --beta"), bad.stderr


def test_verify_after_accumulating(tmp_path: Path, client: Client) -> None:
    """--verify checks α·A·B + β·C_old from the kept originals; C wrong by a little more than
    rounding in one element fails, and C is put back as it was, bit for bit."""
    import pipeline.accumulate.tasks as acc

    a_url, b_url, c_url, c0 = setup(tmp_path)
    result = multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=ALPHA,
                      beta=BETA, verify=True)  # fmt: skip
    assert result.verified is True
    assert_once(c_url, expected(a_url, b_url, c0, ALPHA, BETA))
    # A wrong element (an update lost in one tile) must fail the check.
    c1 = stored(Path(c_url))
    real = acc.combine

    def lossy(spec: Any, product: Any, old: Any) -> Any:
        out = real(spec, product, old)
        if old is not None:
            out[0, 0] = old[0, 0]  # the product never added here
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(acc, "combine", lossy)
        with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cl, \
                Client(cl) as local:  # fmt: skip
            bad = multiply(a_url, b_url, c_url, client=local, accumulate=True, verify=True)
    assert bad.verified is False
    assert stored(Path(c_url)) == c1, "C is back as it was before the failed accumulation"
    assert not (Path(c_url) / SIDECAR).exists()


def test_verify_of_an_alpha_scaled_product(tmp_path: Path, client: Client) -> None:
    from pipeline import verify_product

    a_url, b_url, _, _ = setup(tmp_path)
    out = str(tmp_path / "scaled.zarr")
    assert multiply(a_url, b_url, out, client=client, alpha=-3.0, verify=True).verified is True
    assert verify_product(client, a_url, b_url, out).passed  # α read from OUT's attributes
    assert not verify_product(client, a_url, b_url, out, alpha=1.0).passed
