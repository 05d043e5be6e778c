"""Which GPUs this process can use: the NVIDIA driver's answer, asked once.

Apart from :mod:`gdscp.memory` so that a command which never makes a host
array (``gdscp copy``) can check its GPU without importing numpy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import _args, _core

__all__ = ["DeviceError", "GpuStatus", "gpu_available", "device_count", "check_device", "device_memory"]


class DeviceError(ValueError):
    """A GPU that was asked for does not exist or cannot be used."""


@dataclass(frozen=True)
class GpuStatus:
    """Whether GPU buffers can be made here; ``reason`` says why not. True in ``if``."""

    available: bool
    reason: str
    count: int

    def __bool__(self) -> bool:
        return self.available


@functools.lru_cache(maxsize=1)
def gpu_available() -> GpuStatus:
    """Can this process allocate GPU memory? Needs an NVIDIA driver and a GPU."""
    info = _core.cuda_info()
    if not info["available"]:
        return GpuStatus(False, info["error"] or "the NVIDIA driver could not be loaded", 0)
    count = len(info["gpus"])
    if count == 0:
        return GpuStatus(False, "the NVIDIA driver reports no GPU", 0)
    return GpuStatus(True, f"{count} GPU{'s' if count != 1 else ''}", count)


def device_count() -> int:
    """GPUs usable here (0 without a driver or a GPU)."""
    return gpu_available().count


def check_device(device: int) -> None:
    """Raise ``DeviceError`` unless GPU ``device`` can be used (``TypeError``
    unless it is an integer)."""
    device = _args.integer(device, "device")
    status = gpu_available()
    if not status:
        raise DeviceError(f"GPU {_args.shown(device)} cannot be used: {status.reason}")
    if not 0 <= device < status.count:
        have = "GPU 0" if status.count == 1 else f"GPUs 0-{status.count - 1}"
        raise DeviceError(f"GPU {_args.shown(device)} does not exist (this machine has {have})")


def device_memory(device: int) -> tuple[int, int]:
    """(free, total) bytes of GPU ``device``."""
    check_device(device)
    free, total = _core.device_memory_info(device)
    return int(free), int(total)
