"""Where benchmark data lands: host memory (numpy) or one GPU (gdscp.memory: CuPy where it works)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import memory

__all__ = ["HostTarget", "GpuTarget", "make_target"]


class HostTarget:
    """Pageable host memory, as a user's numpy array would be."""

    kind = "host"
    device = None

    def empty(self, nbytes: int) -> np.ndarray:
        buf = memory.allocate(nbytes)  # page-aligned, as a careful user's buffer would be
        buf.fill(0)  # fault the pages in now, not inside the first timed run
        return buf

    def sync(self) -> None:
        return None

    def to_numpy(self, buf: Any, start: int, stop: int) -> np.ndarray:
        return np.asarray(buf[start:stop])

    def __enter__(self) -> "HostTarget":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class GpuTarget:
    """Memory of one GPU, from ``memory.allocate``: a CuPy array where CuPy
    works, else gdscp's own DeviceBuffer (nothing beyond gdscp needed). Used as
    a context manager, it makes the device current for the code inside (for
    CuPy; the engine finds each buffer's GPU itself)."""

    kind = "gpu"

    def __init__(self, device: int = 0):
        self.device = int(device)
        memory.check_device(self.device)
        self.cupy = memory.usable_cupy()
        self._device = self.cupy.cuda.Device(self.device) if self.cupy is not None else None

    def empty(self, nbytes: int) -> Any:
        buf = memory.allocate(nbytes, self.device)
        memory.fill(buf, "zeros")  # the pages mapped now, not inside the first timed run
        self.sync()
        return buf

    def sync(self) -> None:
        # Every copy the libraries made, on whichever stream, must be complete
        # before a host clock is read.
        if self._device is not None:
            self._device.synchronize()
        else:
            from .. import _core  # noqa: PLC0415

            _core.device_synchronize(self.device)

    def to_numpy(self, buf: Any, start: int, stop: int) -> np.ndarray:
        return memory.to_host(buf[start:stop])

    def upload(self, dst: Any, host: np.ndarray, nbytes: int) -> None:
        """Copy ``nbytes`` of ``host`` into the device buffer ``dst``."""
        memory.copy_from_host(dst[:nbytes], host[:nbytes])

    def download(self, src: Any, host: np.ndarray, nbytes: int) -> None:
        """Copy ``nbytes`` of the device buffer ``src`` into ``host``."""
        memory.download(src[:nbytes], host[:nbytes])

    def __enter__(self) -> "GpuTarget":
        if self._device is not None:
            self._device.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._device is not None:
            self._device.__exit__(*exc)


def make_target(kind: str, device: int = 0):
    """A target for ``kind`` "host" or "gpu"."""
    if kind == "host":
        return HostTarget()
    if kind == "gpu":
        return GpuTarget(device)
    raise ValueError(f"unknown memory kind {kind!r} (expected 'host' or 'gpu')")
