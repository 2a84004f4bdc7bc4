"""verify's reads of C that fail on a corrupt chunk (pipeline/verify/tasks.py): the noise
measurement's and the symmetry check's, block and mirror, each name C, the chunk and the fix
ending ", then verify again" (benchmarks/mutate.py, target verify-standardized)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.verify import tasks
from pipeline.verify.tasks import CheckSpec
from tests.helpers import write_array
from tests.pipeline.test_verify_unit import make_job, matrices, reference, spec_of


def corrupt(url: str, chunk: str) -> None:
    (Path(url) / "c" / chunk.replace(".", "/")).write_bytes(b"not a chunk")


def named(url: str, chunk: str, rows: str) -> str:
    """The start and end of InputError's words for chunk ``chunk`` (``i.j``) of C."""
    key = chunk.replace(".", "/")
    return rf"^C \({url}\) has a chunk that cannot be read: {url}/c/{key} \(rows {rows}, .*" + (
        r"; restore that chunk from a good copy or rewrite C, then verify again$"
    )


def test_a_corrupt_chunk_of_c_in_the_sampled_rows_is_named(tmp_path: Path) -> None:
    a, b = matrices(8, 4, 8, "float64")
    job = make_job(tmp_path, a, b, a @ b, sample=[(0, 4)])
    ref = reference(job)
    corrupt(job.urls[2], "0.1")
    with pytest.raises(InputError, match=named(job.urls[2], "0.1", "0:4")):
        tasks.measure_noise(job, ref)


@pytest.mark.parametrize(
    ("chunk", "rows"),
    [
        ("0.1", "0:4"),  # right of the diagonal: the row block's own read
        ("1.0", "4:8"),  # below it: the mirror's read
    ],
)
def test_a_corrupt_chunk_of_a_symmetric_c_is_named(tmp_path: Path, chunk: str, rows: str) -> None:
    x = np.random.default_rng(1).uniform(-1, 1, (8, 8))
    c = x + x.T
    url = write_array(tmp_path / "c.zarr", c, (4, 4))
    spec = spec_of(c, (4, 4))
    job = CheckSpec((url, url, url), {}, (spec, spec, spec), np.ones((8, 1)), [])
    assert tasks.asymmetric(job, (0, 4)) == 0
    corrupt(url, chunk)
    with pytest.raises(InputError, match=named(url, chunk, rows)):
        tasks.asymmetric(job, (0, 4))
