"""Where benchmark data lands: host memory (numpy) or one GPU (CuPy, imported lazily)."""

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
    """Memory of one GPU, through CuPy. Used as a context manager, it makes the
    device current for the code inside."""

    kind = "gpu"

    def __init__(self, device: int = 0):
        import cupy

        self.cupy = cupy
        self.device = int(device)
        self._device = cupy.cuda.Device(self.device)

    def empty(self, nbytes: int) -> Any:
        buf = memory.allocate(nbytes, self.device)
        with self._device:
            buf.fill(0)
            self._device.synchronize()
        return buf

    def sync(self) -> None:
        # Every copy the libraries made, on whichever stream, must be complete
        # before a host clock is read.
        self._device.synchronize()

    def to_numpy(self, buf: Any, start: int, stop: int) -> np.ndarray:
        with self._device:
            return self.cupy.asnumpy(buf[start:stop])

    def upload(self, dst: Any, host: np.ndarray, nbytes: int) -> None:
        """Copy ``nbytes`` of ``host`` into the device buffer ``dst``."""
        with self._device:
            dst[:nbytes].set(host[:nbytes])

    def download(self, src: Any, host: np.ndarray, nbytes: int) -> None:
        """Copy ``nbytes`` of the device buffer ``src`` into ``host``."""
        with self._device:
            src[:nbytes].get(out=host[:nbytes])

    def free_memory(self) -> int:
        with self._device:
            free, _total = self.cupy.cuda.runtime.memGetInfo()
        return int(free)

    def __enter__(self) -> "GpuTarget":
        self._device.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._device.__exit__(*exc)


def make_target(kind: str, device: int = 0):
    """A target for ``kind`` "host" or "gpu"."""
    if kind == "host":
        return HostTarget()
    if kind == "gpu":
        return GpuTarget(device)
    raise ValueError(f"unknown memory kind {kind!r} (expected 'host' or 'gpu')")
