"""The doctor's GPU probe, run in a child process (``python -m kernels.device.doctor_probe``) so the
doctor itself never holds a CUDA context: prints a JSON list of checks {check, status, detail,
fix}. Needs a real GPU; nothing here has run on one yet (written against the installed APIs)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels.constants import CUBLAS_INSTALL, CUDA_INSTALL
from kernels.cuda.host import exit_skipping_teardown

ODD = (257, 271, 263)
"""m, k, n of the correctness products: ragged against every tile size."""


def check(name: str, status: str, detail: str, fix: str = "") -> dict[str, str]:
    return {"check": name, "status": status, "detail": detail, "fix": fix}


def devices() -> tuple[dict[str, str], Any]:
    try:
        from numba import cuda
    except ImportError as e:
        return check("devices", "fail", f"no CUDA packages ({e})", CUDA_INSTALL), None
    try:
        gpus = list(cuda.gpus)
    except Exception as e:  # noqa: BLE001 - cuInit failed: name the code
        fix = (
            "expose the GPUs (--gpus all), fix CUDA_VISIBLE_DEVICES, "
            "or reboot after a driver upgrade"
        )
        return check("devices", "fail", f"CUDA init failed: {e}", fix), None
    if not gpus:
        return check(
            "devices", "fail", "the driver sees no GPU", "check CUDA_VISIBLE_DEVICES"
        ), None
    shown = []
    for gpu in gpus:
        with gpu:
            dev = cuda.get_current_device()
            free, total = cuda.current_context().get_memory_info()
            cc = dev.compute_capability
            shown.append(
                f"{dev.name} CC {cc[0]}.{cc[1]} {total / 2**30:.0f} GiB ({free / 2**30:.0f} free)"
            )
    nvml, fix = nvml_facts()
    return check("devices", "warn" if fix else "pass", "; ".join([*shown, nvml]), fix), cuda


def nvml_facts(module: Any = None) -> tuple[str, str]:
    """(MIG mode and CPU affinity of each GPU, the fix when MIG is on), from NVML."""
    from kernels.device.nvml import describe, gpu_facts

    try:
        return describe(gpu_facts(module))
    except Exception as e:  # noqa: BLE001 - no NVML (missing wheel or library): say so
        return f"NVML unavailable ({type(e).__name__}: {e}): MIG and CPU affinity unknown", ""


def kernels_vs_numpy(shape: tuple[int, int, int] = ODD) -> dict[str, str]:
    from kernels.cuda.host import CudaAccumulator

    m, k, n = shape
    half = k // 2
    rng = np.random.default_rng(0)
    errors = []
    for dtype, tol in (("float32", 1e-5), ("float64", 1e-13)):
        a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
        acc = CudaAccumulator((m, n), np.dtype(dtype))
        acc.add(a[:, :half], b[:half])
        acc.add(a[:, half:], b[half:])
        want = a.astype("float64") @ b.astype("float64")
        err = float(np.max(np.abs(acc.result() - want)) / np.max(np.abs(want)))
        errors.append((dtype, err, tol))
    bad = [f"{d} {e:.1e} > {t:.0e}" for d, e, t in errors if e > t]
    text = ", ".join(f"{d} {e:.1e}" for d, e, _ in errors)
    if bad:
        return check(
            "kernels", "fail", f"cuda {m}x{k}x{n}: {', '.join(bad)}", "--backend cpu or cublas"
        )
    return check("kernels", "pass", f"cuda {m}x{k}x{n} in 2 panels vs float64 numpy: {text}")


def _best(run: Callable[[], None], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def bandwidth(cuda: Any, nbytes: int = 256 << 20) -> tuple[list[dict[str, str]], float]:
    """Pinned and pageable host->device copies, best of 3, the bytes checked."""
    try:
        pinned = cuda.pinned_array(nbytes, dtype=np.uint8)
    except Exception as e:  # noqa: BLE001 - pinning refused (container limits, WSL)
        fix = "a smaller --device-memory-limit, or allow pinned memory (docker --ulimit memlock=-1)"
        return [check("pinned", "fail", f"pinning {nbytes >> 20} MiB failed: {e}", fix)], 0.0
    pinned[:] = np.arange(nbytes, dtype=np.uint64).astype(np.uint8)
    pageable = np.array(pinned)
    dev = cuda.device_array(nbytes, dtype=np.uint8)
    rates = {}
    for kind, host in (("pinned", pinned), ("pageable", pageable)):
        rates[kind] = nbytes / _best(lambda h=host: (dev.copy_to_device(h), cuda.synchronize()))
    same = bool((dev.copy_to_host() == pinned).all())
    status = "pass" if same else "fail"
    found = [check("pinned", "pass", f"{nbytes >> 20} MiB pinned")]
    detail = (
        f"host->device pinned {rates['pinned'] / 1e9:.1f} GB/s, "
        f"pageable {rates['pageable'] / 1e9:.1f} GB/s"
    )
    warn = same and rates["pinned"] < 1.2 * rates["pageable"]
    found.append(
        check("bandwidth", "warn" if warn else status, detail + ("" if same else "; bytes differ"))
    )
    return found, rates["pinned"]


def speed_and_figures() -> list[dict[str, str]]:
    """Our kernel's rate (the worker's calibration, saved for the planner) against cuBLAS."""
    from kernels.cuda.cublas import CublasUnavailableError, load_cupy
    from kernels.device.figures import store_path
    from kernels.device.rates import worker_device_figures

    out = []
    figures = {dt: worker_device_figures(dt) for dt in ("float32", "float64")}
    f32 = figures["float32"] or {}
    rate = f32.get("float32_flops", 0.0)
    out.append(check("speed", "pass", f"our float32 kernel {rate / 1e12:.1f} TFLOP/s at 2048³"))
    try:
        cupy = load_cupy()
        n = 2048
        a = cupy.ones((n, n), dtype=cupy.float32)
        c = cupy.zeros((n, n), dtype=cupy.float32)

        def gemm() -> None:
            cupy.cublas.gemm("N", "N", a, a, out=c, alpha=1.0, beta=1.0)
            cupy.cuda.runtime.deviceSynchronize()

        gemm()
        cublas = 2 * n**3 / _best(gemm)
        out.append(
            check(
                "cublas", "pass", f"cuBLAS {cublas / 1e12:.1f} TFLOP/s; ours {rate / cublas:.2f}x"
            )
        )
    except CublasUnavailableError as e:
        out.append(check("cublas", "warn", e.reason, CUBLAS_INSTALL))
    out.append(check("figures", "pass", f"saved for the planner in {store_path()}"))
    return out


def nvcomp_round_trip(shape: tuple[int, int] = (256, 192)) -> dict[str, str]:
    """A zstd frame from numcodecs decoded on the device by our decoder, bytes compared."""
    from numba import cuda
    from numcodecs import Zstd

    from kernels.device.decode import ChunkPiece, CompressedPanel, PanelDecoder

    try:
        from nvidia import nvcomp  # noqa: F401 - the decoder imports it again
    except ImportError:
        return check("nvcomp", "skip", "nvCOMP not installed (only --gpu-decode needs it)")
    rng = np.random.default_rng(0)
    data = np.round(rng.standard_normal(shape) * 100).astype(np.float32)  # rounded: compresses
    frame = np.frombuffer(Zstd().encode(data), dtype=np.uint8)
    piece = ChunkPiece(0, frame.size, shape, (0, shape[0], 0, shape[1]), (0, 0))
    panel = CompressedPanel((piece,), "<f4", frame.size, data.nbytes)
    stream = cuda.stream()
    dest = cuda.device_array(shape, dtype=np.float32)
    try:
        kept = PanelDecoder(stream).decode_into(frame.copy(), panel, dest)
        stream.synchronize()
        del kept
        got = dest.copy_to_host()
    except Exception as e:  # noqa: BLE001 - the decode's own error is the finding
        fix = "check nvidia-nvcomp matches the driver's CUDA major; or leave out --gpu-decode"
        return check("nvcomp", "fail", f"decoding a zstd frame failed: {e}", fix)
    size = f"{frame.size} B zstd -> {data.nbytes} B"
    if got.tobytes() != data.tobytes():
        wrong = int(np.count_nonzero(got != data))
        fix = "leave out --gpu-decode; report the nvCOMP and driver versions"
        return check("nvcomp", "fail", f"{size}: {wrong} of {data.size} elements differ", fix)
    return check("nvcomp", "pass", f"{size} decoded on the device, bytes equal to numcodecs")


def main() -> None:
    device, cuda = devices()
    found = [device]
    if cuda is not None:
        steps = (kernels_vs_numpy, lambda: bandwidth(cuda)[0], speed_and_figures, nvcomp_round_trip)
        for step in steps:
            try:
                result = step()
                found += result if isinstance(result, list) else [result]
            except Exception as e:  # noqa: BLE001 - report and go on, as the doctor does
                found.append(
                    check(getattr(step, "__name__", "gpu"), "fail", f"{type(e).__name__}: {e}")
                )
    print(json.dumps(found))


if __name__ == "__main__":
    main()
    exit_skipping_teardown(0)
