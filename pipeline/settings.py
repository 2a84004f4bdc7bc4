"""The ``tilegemm.*`` dask-config settings: every key, its default, its allowed values, and one
reader that normalises what dask parsed (``DASK_TILEGEMM__OUTPUT_COMPRESSOR=none`` arrives as
None) and refuses a bad value with one line naming the key, the value, the choices and the fix.

``check_all()`` runs at the start of ``prepare``, so a bad or misspelled setting is refused
before any work; the readers call ``get(key)``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import dask
from dask.utils import parse_bytes

from kernels.device.emulated import DECODE_GBPS
from pipeline.errors import UsageError
from pipeline.plan.device_model import DEVICE_CLASSES
from pipeline.plan.limits import MAX_TASKS

NAMESPACE = "tilegemm"


@dataclass(frozen=True)
class Setting:
    """One ``tilegemm.<key>`` setting."""

    key: str
    """Under ``tilegemm.``, dask's spelling (hyphens; ``.`` nests)."""
    default: Any
    allowed: str
    """The values it takes, as the error and the docs say them."""
    meaning: str
    parse: Callable[[Any], Any]
    """The value as dask gives it -> the normalised value; ValueError/TypeError when bad."""
    example: str
    """A valid value, for the fix in an error line."""

    @property
    def name(self) -> str:
        return f"{NAMESPACE}.{self.key}"

    @property
    def env(self) -> str:
        """The environment variable dask reads it from."""
        return "DASK_" + self.name.upper().replace(".", "__").replace("-", "_")


def _either(names: Iterable[str]) -> str:
    *most, last = names
    return f"{', '.join(most)} or {last}" if most else last


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value is None and "none" in options:  # dask reads "none" from the environment as None
            return "none"
        if isinstance(value, str) and value.lower() in options:
            return value.lower()
        raise ValueError(value)

    return parse


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    words = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
    if isinstance(value, str) and value.lower() in words:
        return words[value.lower()]
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(value)


def _number(value: Any) -> float:
    """A real number; bools are refused (``True`` is not 1.0 GB/s)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(value)
    return float(value)


def _positive(value: Any) -> float:
    number = _number(value)
    if not number > 0 or number == float("inf"):
        raise ValueError(value)
    return number


def _fraction(value: Any) -> float:
    number = _number(value)
    if not 0 <= number <= 1:
        raise ValueError(value)
    return number


def _concurrency(value: Any) -> int | str:
    if isinstance(value, str) and value.lower() == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(value)
    count = int(value)
    if count < 0:
        raise ValueError(value)
    return count


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(value)
    count = int(str(value).replace("_", ""))
    if count < 1:
        raise ValueError(value)
    return count


def parse_size(text: str) -> int:
    """'4GiB', '512MB', '1e9' or '100' (bytes) to a positive number of bytes, read by dask's
    own parser (as ``dask worker`` and dask's config read sizes)."""
    try:
        size = parse_bytes(text) if str(text).strip() else 0  # dask reads "" as 1 byte
    except (ValueError, TypeError):
        size = 0
    if size <= 0:
        raise UsageError(
            f"cannot read size {text!r}; write a positive number with an optional unit, "
            "e.g. 4GiB, 512MB or 1000000"
        )
    return size


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(value)
    size = parse_size(value) if isinstance(value, str) else value
    if size <= 0:
        raise ValueError(value)
    return size


SETTINGS = {
    s.key: s
    for s in (
        Setting(
            "output-compressor", "auto", "auto, none, lz4 or zstd",
            "OUT's codec; auto: none for float and complex products, Blosc-LZ4 for integers",
            _choice("auto", "none", "lz4", "zstd"), "lz4",
        ),
        Setting(
            "cache-fraction", 0.5, "a number from 0 to 1",
            "share of a worker's spare memory that caches decoded panels (0: no cache)",
            _fraction, "0.5",
        ),
        Setting(
            "read-concurrency", "auto", "auto or an integer >= 0",
            "chunks one panel read decodes at once; auto: 2 from local files (1 on the staged "
            "GPU path), zarr's default elsewhere; 0: zarr's default",
            _concurrency, "2",
        ),
        Setting(
            "max-tasks", MAX_TASKS, "an integer >= 1",
            "tile tasks one plan may submit; a plan needing more is refused before OUT exists",
            _count, "2000000",
        ),
        Setting(
            "host-probe", True, "true or false",
            "scale the calibrated cost model to this host by its BLAS, zstd and Python speed "
            "(measured once, about 0.7 s; saved in $XDG_CACHE_HOME/tilegemm/hosts.json); "
            "false: the calibration's constants as committed",
            _flag, "true",
        ),
        Setting(
            "gpu-overlap", True, "true or false",
            "staged GPU path: overlap decoding, copies and kernels (false: in series)",
            _flag, "true",
        ),
        Setting(
            "device-class", "h100-pcie", _either(DEVICE_CLASSES),
            "GPU whose vendor figures plan cuda/cublas jobs before the workers are measured",
            _choice(*DEVICE_CLASSES), "h100-pcie",
        ),
        Setting(
            "emulated.tflops", 10.0, "a number > 0",
            "emulated backend: float32 TFLOP/s (float64 runs at half)", _positive, "10",
        ),
        Setting(
            "emulated.h2d-gbps", 25.0, "a number > 0",
            "emulated backend: host-to-device copy GB/s", _positive, "25",
        ),
        Setting(
            "emulated.decode-gbps", DECODE_GBPS, "a number > 0",
            "emulated backend with --gpu-decode: zstd decoded on the device, GB/s",
            _positive, "50",
        ),
        Setting(
            "emulated.memory", "80GiB", "a size > 0 (bytes, or with a unit)",
            "emulated backend: device memory per worker", _size, "80GiB",
        ),
    )
}  # fmt: skip
"""Every ``tilegemm.*`` setting (docs/cli.md lists them from here)."""


def get(key: str) -> Any:
    """The setting ``tilegemm.<key>``, normalised; UsageError when its value is bad."""
    setting = SETTINGS[key]
    value = dask.config.get(setting.name, setting.default)
    try:
        return setting.parse(value)
    except (TypeError, ValueError, UsageError):
        raise UsageError(_bad_value(setting, value)) from None


def check_all() -> None:
    """Refuse a bad value of any setting, or a ``tilegemm.*`` key that is none of them."""
    given = dask.config.get(NAMESPACE, {})
    if not isinstance(given, dict):
        raise UsageError(
            f"{NAMESPACE} is {given!r}, not a group of settings; set its keys instead, e.g. "
            f"{SETTINGS['output-compressor'].env}=lz4"
        )
    for key in _flatten(given):
        if key not in SETTINGS:
            raise UsageError(_unknown(key))
    for key in SETTINGS:
        get(key)


def _flatten(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """Leaf keys, dask's spelling (``read_concurrency`` from the environment is
    ``read-concurrency``)."""
    keys = []
    for key, value in tree.items():
        name = prefix + str(key).replace("_", "-")
        keys += _flatten(value, name + ".") if isinstance(value, dict) else [name]
    return keys


def _bad_value(setting: Setting, value: Any) -> str:
    shown = "none" if value is None else repr(value)
    fix = f"e.g. {setting.env}={setting.example}"
    where = os.environ.get(setting.env)
    if where is not None:
        source = f"(from {setting.env}={where})"
        return f"{setting.name} is {shown} {source}; use {setting.allowed}, {fix}, or unset it"
    return (
        f"{setting.name} is {shown}; use {setting.allowed}, {fix} or "
        f'dask.config.set({{"{setting.name}": ...}})'
    )


def _unknown(key: str) -> str:
    close = difflib.get_close_matches(key, list(SETTINGS), n=1, cutoff=0.6)
    hint = f"did you mean {NAMESPACE}.{close[0]}? " if close else ""
    env = "DASK_" + f"{NAMESPACE}.{key}".upper().replace(".", "__").replace("-", "_")
    return (
        f"{NAMESPACE}.{key} is not a setting of this tool ({env} or dask config); {hint}"
        f"the settings are {', '.join(SETTINGS)} (see docs/cli.md)"
    )
