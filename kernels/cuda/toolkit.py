"""Which CUDA toolkit pieces numba-cuda links our kernels with, and whether the driver can load
the result: NVVM writes PTX of its own toolkit's ISA; nvJitLink links it into a cubin any driver
of the same major loads (minor-version compatibility); without nvJitLink the driver JITs the PTX
itself and refuses an ISA newer than its own CUDA (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)."""

from __future__ import annotations

from importlib import metadata

Version = tuple[int, int]


def link_problem(
    nvvm: Version | None, nvjitlink: Version | None, driver: Version | None
) -> str | None:
    """None when a kernel compiled by NVVM ``nvvm`` loads, else what fails and the fix.
    Versions are CUDA (major, minor); None: not found (``driver``: not known yet)."""
    if nvvm is None:
        return "numba-cuda finds no NVVM to compile kernels; fix: pip install 'numba-cuda[cu13]'"
    want = f"{nvvm[0]}.{nvvm[1]}"
    if nvjitlink is not None and nvjitlink < nvvm:
        return (
            f"nvJitLink {nvjitlink[0]}.{nvjitlink[1]} is older than NVVM {want}: linking fails "
            f"(ERROR 4 in nvvmAddNVVMContainerToProgram); fix: pip install "
            f"'nvidia-nvjitlink>={want}' (no older than nvidia-nvvm)"
        )
    if nvjitlink is None and (driver is None or driver < nvvm):
        seen = "an unknown CUDA" if driver is None else f"CUDA {driver[0]}.{driver[1]}"
        return (
            f"no nvJitLink: the driver ({seen}) must JIT NVVM {want}'s PTX itself and refuses "
            f"a newer ISA (CUDA_ERROR_UNSUPPORTED_PTX_VERSION at the first launch); fix: pip "
            f"install 'nvidia-nvjitlink>={want}', or an nvidia-nvvm no newer than the driver"
        )
    return None


def package_version(name: str) -> Version | None:
    """(major, minor) of an installed distribution, None when it is not installed."""
    try:
        parts = metadata.version(name).split(".")
        return int(parts[0]), int(parts[1])
    except (metadata.PackageNotFoundError, ValueError, IndexError):
        return None


def nvvm_version() -> Version | None:
    """The CUDA version of the NVVM wheel numba-cuda compiles with (None: not installed)."""
    return package_version("nvidia-nvvm") or package_version("nvidia-cuda-nvcc-cu12")


def nvjitlink_version() -> Version | None:
    """nvJitLink as numba-cuda would load it (None: missing, or older than the 12.3 it needs)."""
    try:
        from cuda.bindings import nvjitlink

        found = tuple(int(v) for v in nvjitlink.version())[:2]
    except Exception:  # noqa: BLE001 - no bindings or no library: numba-cuda links without it
        return None
    return (found[0], found[1]) if found >= (12, 3) else None


def driver_version() -> Version | None:
    """The CUDA version the driver supports (needs a driver: call on a GPU worker)."""
    try:
        from numba.cuda.cudadrv.driver import driver

        return tuple(driver.get_version())[:2]  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - no driver
        return None


def check_link() -> None:
    """RuntimeError naming the missing or older nvJitLink and the fix, before a first launch
    would fail with a bare CUDA_ERROR_UNSUPPORTED_PTX_VERSION."""
    problem = link_problem(nvvm_version(), nvjitlink_version(), driver_version())
    if problem:
        raise RuntimeError(problem)
