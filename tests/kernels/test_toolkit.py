"""The link check: a missing or older nvJitLink is named with its fix before a launch fails."""

from __future__ import annotations

import re

import pytest

from kernels.cuda import host as cuda_host
from kernels.cuda import toolkit
from kernels.cuda.toolkit import link_problem


@pytest.mark.parametrize(
    ("nvvm", "nvjitlink", "driver", "problem"),
    [
        ((13, 5), (13, 5), (13, 0), None),  # CI's wheels on a 580 driver: linked to a cubin
        ((13, 0), (13, 0), (13, 0), None),  # the offline node's wheels
        ((13, 0), None, (13, 0), None),  # no nvJitLink, PTX no newer than the driver
        ((13, 5), None, (13, 0), r"no nvJitLink: the driver \(CUDA 13.0\).*UNSUPPORTED_PTX"),
        ((13, 5), None, None, r"an unknown CUDA.*nvidia-nvjitlink>=13.5"),
        ((13, 5), (13, 0), (13, 5), r"nvJitLink 13.0 is older than NVVM 13.5.*>=13.5"),
        (None, (13, 5), (13, 0), r"no NVVM.*numba-cuda\[cu13\]"),
    ],
)
def test_link_problem(
    nvvm: tuple[int, int] | None,
    nvjitlink: tuple[int, int] | None,
    driver: tuple[int, int] | None,
    problem: str | None,
) -> None:
    found = link_problem(nvvm, nvjitlink, driver)
    if problem is None:
        assert found is None
    else:
        assert found is not None and "fix: " in found
        assert re.search(problem, found), found


def test_first_jit_on_a_gpu_names_an_old_nvjitlink(monkeypatch: pytest.MonkeyPatch) -> None:
    from numba import config

    monkeypatch.setattr(toolkit, "nvvm_version", lambda: (13, 5))
    monkeypatch.setattr(toolkit, "nvjitlink_version", lambda: (13, 0))
    monkeypatch.setattr(toolkit, "driver_version", lambda: (13, 0))
    monkeypatch.setattr(config, "ENABLE_CUDASIM", 0)  # as on a real GPU: never compiled here

    def kernel(a, b, c):  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(RuntimeError, match=r"nvJitLink 13.0 is older than NVVM 13.5"):
        cuda_host.jit_kernel(kernel, None)


def test_this_machine_links() -> None:
    """CI's pinned wheels: nvvm and nvjitlink of one version (constraints.txt keeps them so)."""
    assert toolkit.nvvm_version() is not None
    assert link_problem(toolkit.nvvm_version(), toolkit.nvjitlink_version(), None) is None
