"""``gdscp benchmark`` as a library: measure gdscp against plain Python reads,
``numpy.fromfile`` + ``cupy.asarray``, KvikIO and the machine's own ceilings.

``run_benchmark(BenchConfig(...))`` runs everything and returns one JSON-ready
dict (described in docs/benchmark-json.md). The pieces are usable alone, for
device scripts: ``make_file``, ``drop_cache``, ``time_seq_read``,
``time_seq_write``, ``time_random_reads``, the ceiling functions in
``gdscp.bench.ceilings`` and the tools in ``gdscp.bench.tools``.
"""

from .ceilings import (
    buffered_read_rate,
    buffered_write_rate,
    direct_read_rate,
    direct_write_rate,
    host_memcpy_rate,
    page_cache_read_rate,
    pinned_copy_rate,
)
from .config import MODES, BenchConfig, BenchConfigError, Plan, default_size, default_threads, resolve
from .files import BenchFiles, drop_cache, make_file, warm_cache
from .machine import describe_machine
from .measure import BenchError, time_random_reads, time_seq_read, time_seq_write
from .runner import SCHEMA, Benchmark, run_benchmark
from .targets import GpuTarget, HostTarget, make_target
from .tools import GdscpTool, KvikioTool, NumpyCupyTool, PythonTool

__all__ = [
    "MODES",
    "SCHEMA",
    "BenchConfig",
    "BenchConfigError",
    "BenchError",
    "BenchFiles",
    "Benchmark",
    "GdscpTool",
    "GpuTarget",
    "HostTarget",
    "KvikioTool",
    "NumpyCupyTool",
    "Plan",
    "PythonTool",
    "buffered_read_rate",
    "buffered_write_rate",
    "default_size",
    "default_threads",
    "describe_machine",
    "direct_read_rate",
    "direct_write_rate",
    "drop_cache",
    "host_memcpy_rate",
    "page_cache_read_rate",
    "make_file",
    "make_target",
    "pinned_copy_rate",
    "resolve",
    "run_benchmark",
    "time_random_reads",
    "time_seq_read",
    "time_seq_write",
    "warm_cache",
]
