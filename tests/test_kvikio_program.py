"""tests/kvikio_program.py, a program written for KvikIO, run with
``import gdscp as kvikio``: on host memory here, on the stand-ins' device
memory in tests/test_cufile_standin.py, and on a GPU with CuPy (where KvikIO
itself runs it too, if it is installed)."""

from __future__ import annotations

import numpy as np
import pytest

import gdscp
import kvikio_program


class CupyMemory:
    """CuPy arrays, and CuPy streams given to the program as raw ints."""

    device = True

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.streams = []

    def empty(self, nbytes: int):
        return self.cupy.full(nbytes, 0xA5, self.cupy.uint8)

    def from_bytes(self, data: bytes):
        return self.cupy.asarray(np.frombuffer(data, np.uint8))

    def to_bytes(self, array) -> bytes:
        return self.cupy.asnumpy(array).tobytes()

    def stream(self) -> int:
        self.streams.append(self.cupy.cuda.Stream(non_blocking=True))
        return self.streams[-1].ptr


@pytest.mark.parametrize("compat_mode", [None, gdscp.CompatMode.ON, gdscp.CompatMode.AUTO])
def test_kvikio_program_on_host_memory(page_cache_folder, compat_mode):
    import gdscp as kvikio

    kvikio_program.run(kvikio, kvikio_program.HostMemory(), str(page_cache_folder), compat_mode)


@pytest.mark.gpu
def test_kvikio_program_on_a_gpu(page_cache_folder):
    import gdscp as kvikio

    kvikio_program.run(kvikio, CupyMemory(), str(page_cache_folder))


@pytest.mark.gpu
@pytest.mark.parametrize("memory", [kvikio_program.HostMemory, CupyMemory])
def test_kvikio_itself_runs_the_same_program(page_cache_folder, memory):
    """The program is KvikIO's as much as gdscp's: KvikIO runs it unchanged."""
    kvikio = pytest.importorskip("kvikio")
    kvikio_program.run(kvikio, memory(), str(page_cache_folder))
