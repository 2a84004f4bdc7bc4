"""Client side: the GPU a plan is made for — calibrated on the workers, the emulated
device's configured figures, a named device class's vendor figures, or the record of a GPU
that `doctor` measured and saved."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from distributed import Client

from kernels.backends import get_backend
from kernels.device.rates import worker_device_figures
from pipeline import settings
from pipeline.plan.device_model import DEVICE_CLASSES, DeviceModel

if TYPE_CHECKING:
    from pipeline.options.job_options import JobOptions


def device_model(options: JobOptions, live: dict[str, Any] | None, backend: str) -> DeviceModel:
    """The workers' calibrated GPU when known, the emulated device's figures, the device
    class asked for (--device-class), a GPU `doctor` saved, else the configured device
    class's vendor figures (``tilegemm.device-class``); capped by --device-memory-limit."""
    model = (live or {}).get("device")
    if get_backend(backend).modelled:
        p = emulated_params()
        memory = int(p.get("memory_bytes") or 80 * 2**30)
        model = DeviceModel(
            "emulated",
            memory,
            p["tflops"] * 1e12,
            p["tflops"] * 5e11,
            p["h2d_gbps"] * 1e9,
            "emulated",
            p["decode_gbps"] * 1e9,
        )
    if model is None and options.device_class:
        model = DEVICE_CLASSES[options.device_class]
    if model is None:
        model = saved_device() or DEVICE_CLASSES[settings.get("device-class")]
    cap = options.device_memory_limit
    if isinstance(cap, float):  # a fraction of the device's memory, as dask-cuda reads one
        cap = int(cap * model.memory_bytes)
    memory = min(model.memory_bytes, cap) if cap else model.memory_bytes
    return replace(model, memory_bytes=memory, decodes_chunks=options.gpu_decode)


def saved_device() -> DeviceModel | None:
    """The GPU whose figures `doctor` (or a job's calibration) saved most recently for the
    kernels of this checkout, or None: a dry run without a cluster plans for it."""
    from kernels.device.figures import kernel_source_hash, load_records

    records = [r for r in load_records() if _rated(r.get("figures"))]
    if not records:
        return None
    current = kernel_source_hash()
    fresh = [r for r in records if r["key"].get("kernels") == current]
    if not fresh:
        return None
    record = max(fresh, key=lambda r: str(r.get("date", "")))
    figures, key = record["figures"], record["key"]
    try:
        f32, f64 = (float(x) for x in _rates(figures))
        h2d, memory = float(figures["h2d_bytes_per_second"]), int(key["memory_bytes"])
    except (KeyError, TypeError, ValueError):  # a record written by hand, or damaged
        return None
    if not all(math.isfinite(x) and x > 0 for x in (f32, f64, h2d, memory)):
        return None
    return DeviceModel(
        name=str(key.get("gpu", "GPU")),
        memory_bytes=memory,
        float32_flops=f32,
        float64_flops=f64,
        h2d_bytes_per_second=h2d,
        source=f"saved {record.get('date', '')}".strip(),
    )


def _rates(figures: dict[str, Any]) -> tuple[Any, Any]:
    """A device's float32 and float64 rates from its figures; one not measured follows the
    configured device class's float64/float32 ratio."""
    ratio = DEVICE_CLASSES[settings.get("device-class")]
    f64_per_f32 = ratio.float64_flops / ratio.float32_flops
    f32 = figures.get("float32_flops") or figures["float64_flops"] / f64_per_f32
    return f32, figures.get("float64_flops") or figures["float32_flops"] * f64_per_f32


def _rated(figures: object) -> bool:
    return isinstance(figures, dict) and bool(
        figures.get("float32_flops") or figures.get("float64_flops")
    )


def emulated_params() -> dict[str, float]:
    """The emulated device's figures: dask config ``tilegemm.emulated.tflops`` (float32; float64
    runs at half), ``h2d-gbps``, ``decode-gbps`` (zstd decoded on the device, --gpu-decode) and
    ``memory`` (a size; default 80GiB)."""
    return {
        "tflops": settings.get("emulated.tflops"),
        "h2d_gbps": settings.get("emulated.h2d-gbps"),
        "decode_gbps": settings.get("emulated.decode-gbps"),
        "memory_bytes": float(settings.get("emulated.memory")),
    }


async def _figures_off_the_loop(dtype: str) -> dict[str, Any] | None:
    """On a worker: its figures computed in a thread, so compiling and calibrating (seconds,
    once per process and dtype) never stall the worker's event loop and heartbeats."""
    return await asyncio.to_thread(worker_device_figures, dtype)


def calibrated_device(client: Client, dtype: str = "float32") -> DeviceModel | None:
    """The workers' GPU (the slowest and smallest of them) for a ``dtype`` job: the figures
    saved by `doctor` for that GPU, driver and kernels, else measured there once and saved;
    None where there is no real GPU (the simulator's rates mean nothing). A rate not measured
    (the other dtype) follows the device class's float64/float32 ratio."""
    figures = [f for f in client.run(_figures_off_the_loop, dtype).values() if f]
    if not figures:
        return None
    f32, f64 = zip(*(_rates(f) for f in figures), strict=True)
    sources = sorted({str(f.get("source", "calibrated")) for f in figures})
    return DeviceModel(
        name=str(figures[0]["name"]),
        memory_bytes=int(min(f["memory_bytes"] for f in figures)),
        float32_flops=min(f32),
        float64_flops=min(f64),
        h2d_bytes_per_second=min(f["h2d_bytes_per_second"] for f in figures),
        source=" and ".join(sources),
    )
