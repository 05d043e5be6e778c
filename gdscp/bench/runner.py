"""Run a whole benchmark: files, ceilings, gdscp at each thread count and the
baselines, measured in the same process and interleaved run by run (so a
noisy disk or a neighbour hurts every contender alike)."""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .. import memory
from . import ceilings as ceil
from . import report
from .config import BenchConfig, Plan, resolve
from .files import BenchFiles, drop_cache, expected_bytes, memory_filesystem, warm_cache
from .machine import describe_machine, now_iso
from .measure import (
    BenchError,
    check_read,
    clear_windows,
    random_offsets,
    time_random_reads,
    time_seq_read,
    time_seq_write,
)
from .stats import GB, percentile, spread, threads_text
from .targets import make_target
from .tools import GdscpTool, KvikioTool, NumpyCupyTool, PreadvTool, PythonTool, Tool, kvikio_status

__all__ = ["run_benchmark", "Progress", "SCHEMA"]

SCHEMA = "gdscp-benchmark/1"

#: ``progress(completed, total, description)``: called as each step starts and once at the end.
Progress = Callable[[int, int, str], None]

_WARMUP_RANDOM_OPS = 20


def cupy_missing() -> str:
    """Why the numpy + CuPy baseline cannot run here."""
    try:
        import cupy  # noqa: F401, PLC0415 - only to tell absent from unusable
    except ImportError:
        return "CuPy is not installed"
    return "CuPy cannot use the GPU here"


def _fresh_memory(size: int) -> mmap.mmap:
    """New memory of ``size`` bytes that nothing has touched: a mapping of its
    own, with huge pages asked for from 4 MiB (as numpy asks for its arrays).
    A numpy.empty of up to 32 MiB may instead reuse memory the allocator kept
    from an earlier buffer, already faulted in and holding bytes."""
    fresh = mmap.mmap(-1, max(size, 1))
    if size >= 4 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            fresh.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return fresh


@dataclass(frozen=True)
class Group:
    """One kind of measurement: a mode, a cache state, for random reads an I/O
    size, and the destination buffer: "touched" (allocated and written once,
    before the runs) or "fresh" (new memory for every run, never touched
    before the read: _fresh_memory)."""

    mode: str
    cache: Optional[str]  # "hot", "cold", or None for writes
    io_size: Optional[int] = None
    buffer: str = "touched"

    @property
    def label(self) -> str:
        text = self.mode if self.cache is None else f"{self.mode} {self.cache}"
        if self.io_size is not None:
            text += f" {_size_text(self.io_size)}"
        if self.buffer == "fresh":
            text += " fresh"
        return text


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def groups_for(plan: Plan) -> list[Group]:
    caches = ["hot", "cold"] if plan.drop_cache else ["hot"]
    groups: list[Group] = []
    if "read" in plan.modes:
        groups.append(Group("read", "hot"))
        if plan.memory == "host":
            groups.append(Group("read", "hot", buffer="fresh"))
        groups += [Group("read", cache) for cache in caches if cache != "hot"]
    if "randread" in plan.modes:
        groups += [Group("randread", cache, io) for io in plan.io_sizes for cache in caches]
    if "write" in plan.modes:
        groups.append(Group("write", None))
    return groups


class _Steps:
    def __init__(self, total: int, progress: Optional[Progress]):
        self.total = total
        self.done = 0
        self._progress = progress

    def start(self, description: str) -> None:
        if self._progress is not None:
            self._progress(self.done, self.total, description)

    def finish(self) -> None:
        self.done += 1

    def end(self) -> None:
        self.done = self.total
        if self._progress is not None:
            self._progress(self.total, self.total, "done")


class Benchmark:
    """One benchmark run over a resolved plan. ``run()`` returns the JSON-ready result."""

    def __init__(self, plan: Plan, progress: Optional[Progress] = None, warn: Optional[Callable[[str], None]] = None):
        self.plan = plan
        self._progress = progress
        self._warn = warn or (lambda message: None)
        self.target: Any = None
        self.files: Optional[BenchFiles] = None
        self.buf: Any = None
        self.host: Optional[np.ndarray] = None
        self.baselines: dict[str, dict] = {}
        self.tools: list[Tool] = []
        self.cache_drop: Optional[str] = None
        self.failed: dict[str, str] = {}

    # -- setup ---------------------------------------------------------------------
    def _make_tools(self) -> None:
        plan, target = self.plan, self.target
        for threads in plan.threads:
            self.tools.append(GdscpTool(target, threads))
        if not plan.baselines:
            reason = "baselines were turned off"
            self.baselines = {name: {"available": False, "reason": reason} for name in report.BASELINES}
            return
        python = PythonTool(target, self.host)
        self.tools.append(python)
        self.baselines["python"] = {"available": True, "what": {m: python.describe(m) for m in plan.modes}}
        if target.kind == "host" and "randread" in plan.modes:
            preadv = PreadvTool(target)
            self.tools.append(preadv)
            self.baselines["preadv"] = {"available": True, "what": {"randread": preadv.describe("randread")}}
        else:
            why = "GPU run: Python's readinto + copy is the plain way" if target.kind == "gpu" else (
                "randread was not measured")
            self.baselines["preadv"] = {"available": False, "reason": why}
        if target.kind == "gpu" and memory.usable_cupy() is not None:
            naive = NumpyCupyTool(target)
            self.tools.append(naive)
            self.baselines["numpy_cupy"] = {"available": True, "what": {m: naive.describe(m) for m in plan.modes}}
        elif target.kind == "gpu":
            self.baselines["numpy_cupy"] = {"available": False, "reason": "not measured: " + cupy_missing()}
        else:
            self.baselines["numpy_cupy"] = {
                "available": False,
                "reason": "host-memory run: numpy.fromfile + cupy.asarray is the GPU baseline",
            }
        ok, reason, version = kvikio_status()
        if ok:
            try:
                kv = [KvikioTool(target, threads) for threads in plan.threads]
            except Exception as exc:  # importable, but its library fails to load
                ok, reason = False, f"kvikio failed to load ({type(exc).__name__}: {exc})"
            else:
                self.tools.extend(kv)
                self.baselines["kvikio"] = {
                    "available": True,
                    "version": version,
                    "what": {m: kv[0].describe(m) for m in plan.modes},
                }
        if not ok:
            self.baselines["kvikio"] = {"available": False, "reason": reason}

    def _load_buffer(self) -> None:
        """Fill the benchmark buffer with the data file's bytes (writes then have
        real data to write, and their files can be checked against the source)."""
        assert self.files is not None and self.host is not None
        size = self.plan.size
        with open(self.files.data_path, "rb", buffering=0) as f:
            view = memoryview(self.host)[:size]
            done = 0
            while done < size:
                n = f.readinto(view[done:])
                if not n:
                    raise BenchError(f"{self.files.data_path} is shorter than {size} bytes")
                done += n
        if self.target.kind == "gpu":
            self.target.upload(self.buf, self.host, size)

    def _gdscp_info(self) -> dict:
        import gdscp

        info: dict = {"version": gdscp.__version__, "settings": gdscp.defaults.current()}
        assert self.files is not None
        try:
            with gdscp.CuFile(self.files.data_path, "r") as f:
                info["backend"] = f.backend if self.target.kind == "gpu" else "posix"
                info["backend_reason"] = (
                    f.backend_reason if self.target.kind == "gpu" else "host memory always takes the POSIX path"
                )
        except Exception as exc:
            info["backend"] = "unknown"
            info["backend_reason"] = f"{type(exc).__name__}: {exc}"
        return info

    # -- ceilings ------------------------------------------------------------------
    def _ceiling_jobs(self) -> list[tuple[str, Callable[[int], dict], str, Optional[tuple]]]:
        """(name, function of the run count, description, measurement) for each
        ceiling this run needs. ``measurement`` is the (mode, cache) whose figures
        the ceiling bounds: such a ceiling is measured one run at a time between
        the tools' runs of that measurement, so that a disk or memory bus whose
        speed drifts during the run weighs on the ceiling and the tools alike.
        The functions look up the file paths when they are called."""
        plan = self.plan

        def data() -> str:
            assert self.files is not None
            return self.files.data_path

        def scratch() -> str:
            assert self.files is not None
            return self.files.write_path

        reads = "read" in plan.modes  # random reads have no ceiling
        jobs: list = []
        if not plan.ceilings:
            return jobs
        hot, cold, write = ("read", "hot"), ("read", "cold"), ("write", None)
        copy_bytes = min(plan.size, 1 << 30)
        pinned_bytes = max(copy_bytes, 64 << 20)
        if plan.memory == "gpu":
            if reads:
                jobs.append(
                    (
                        "pinned_h2d",
                        lambda runs: ceil.pinned_copy_rate(pinned_bytes, runs, "h2d", plan.device),
                        "pinned host -> GPU copy",
                        hot,
                    )
                )
            if "write" in plan.modes:
                jobs.append(
                    (
                        "pinned_d2h",
                        lambda runs: ceil.pinned_copy_rate(pinned_bytes, runs, "d2h", plan.device),
                        "GPU -> pinned host copy",
                        write,
                    )
                )
        elif reads:
            for threads in plan.threads:
                jobs.append(
                    (
                        "host_memcpy",
                        (lambda runs, t=threads: ceil.host_memcpy_rate(copy_bytes, t, runs)),
                        f"host memory copy, {threads_text(threads)}",
                        hot,
                    )
                )
                jobs.append(
                    (
                        "page_cache_read",
                        (lambda runs, t=threads: ceil.page_cache_read_rate(data(), plan.size, self.host, t, runs)),
                        f"page cache into host memory, {threads_text(threads)}",
                        hot,
                    )
                )
        if reads and not memory_filesystem(plan.dir):
            for threads in plan.threads:
                jobs.append(
                    (
                        "disk_direct_read",
                        (lambda runs, t=threads: ceil.direct_read_rate(data(), plan.size, t, runs,
                                                                       system_drop=plan.drop_cache)),
                        f"disk O_DIRECT read, {threads_text(threads)}",
                        cold,
                    )
                )
            jobs.append(
                (
                    "disk_buffered_read",
                    lambda runs: ceil.buffered_read_rate(data(), plan.size, runs, system_drop=plan.drop_cache),
                    "disk buffered read, cold",
                    cold,
                )
            )
        if "write" in plan.modes:
            for threads in plan.threads:
                jobs.append(
                    (
                        "disk_direct_write",
                        (lambda runs, t=threads: ceil.direct_write_rate(scratch(), plan.size, t, runs, self.host)),
                        f"disk O_DIRECT write, {threads_text(threads)}",
                        write,
                    )
                )
            jobs.append(
                (
                    "disk_buffered_write",
                    lambda runs: ceil.buffered_write_rate(scratch(), plan.size, runs),
                    "disk buffered write",
                    write,
                )
            )
        return jobs

    def _ceilings_skipped(self) -> dict:
        """Entries for the ceilings this run does not measure. ``applies: false``
        marks those that have nothing to do with its modes or memory."""
        plan = self.plan
        out: dict = {}
        reads = "read" in plan.modes  # random reads have no ceiling

        def skip(name: str, reason: str) -> None:
            out[name] = {**ceil.unavailable(reason), "applies": False}

        if not plan.ceilings:
            for name in ceil.CEILING_NAMES:
                out[name] = ceil.unavailable("ceilings were turned off")
            return out
        if plan.memory != "gpu":
            skip("pinned_h2d", "host-memory run: no GPU copy involved")
            skip("pinned_d2h", "host-memory run: no GPU copy involved")
        else:
            skip("host_memcpy", "GPU run: the pinned copy rate is the ceiling")
            skip("page_cache_read", "GPU run: the pinned copy rate is the ceiling")
        if not reads:
            for name in ("pinned_h2d", "host_memcpy", "page_cache_read", "disk_direct_read", "disk_buffered_read"):
                skip(name, "read mode was not measured")
        elif in_memory := memory_filesystem(plan.dir):
            for name in ("disk_direct_read", "disk_buffered_read"):
                skip(name, f"{plan.dir} is on {in_memory}, which keeps its files in memory only: no disk to read "
                           "them cold from")
        if "write" not in plan.modes:
            for name in ("pinned_d2h", "disk_direct_write", "disk_buffered_write"):
                skip(name, "write mode was not measured")
        return out

    @staticmethod
    def _merge_by_threads(entries: list[dict]) -> dict:
        """A ceiling measured at several thread counts: the best one, plus every
        count under ``by_threads`` (what the plot draws against gdscp's curve)."""
        usable = [e for e in entries if e.get("available")]
        if len(entries) == 1 or not usable:
            return entries[0]
        best = dict(max(usable, key=lambda e: e["gb_per_s"]["median"]))
        best["what"] = best["what"].replace(threads_text(best["threads"]), "best thread count")
        best["by_threads"] = [
            {"threads": e["threads"], "gb_per_s": e["gb_per_s"], "seconds": e["seconds"]} for e in usable
        ]
        return best

    @staticmethod
    def _merge_runs(entries: list[dict]) -> dict:
        """One ceiling (at one thread count) measured one run at a time: a single
        entry holding every run. An unavailable run makes the whole entry so."""
        for entry in entries:
            if not entry.get("available"):
                return entry
        merged = dict(entries[0])
        seconds = [s for e in entries for s in e["seconds"]]
        merged["runs"] = len(seconds)
        merged["seconds"] = seconds
        merged["gb_per_s"] = spread(merged["bytes"] / s / GB for s in seconds)
        return merged

    # -- measurements --------------------------------------------------------------
    def _record(self, tool: Tool, group: Group) -> dict:
        plan = self.plan
        if tool.name == "gdscp" or tool.name == "kvikio":
            task_size = plan.task_size if plan.task_size is not None else _library_task_size(tool)
        else:
            task_size = None
        return {
            "tool": tool.name,
            "mode": group.mode,
            "cache": group.cache,
            "buffer": group.buffer,
            "memory": plan.memory,
            "threads": tool.threads,
            "task_size": task_size,
            "io_size": group.io_size,
            "bytes": plan.size if group.io_size is None else group.io_size * plan.random_ops,
            "runs": plan.runs,
            "what": tool.describe(group.mode)
            + (", page cache dropped before each run" if group.cache == "cold" else "")
            + (", file in the page cache" if group.cache == "hot" else "")
            + (", into new memory each run (a mapping of its own, as numpy.empty makes for a large array), never "
               "touched before" if group.buffer == "fresh" else ""),
            "seconds": [],
        }

    def _one_run(self, tool: Tool, group: Group, run: int, record: dict, samples: list) -> None:
        plan = self.plan
        assert self.files is not None
        data = self.files.data_path
        with tool.configured():
            if group.mode == "read":
                # A fresh buffer as a user makes one: allocated outside the clock, never touched.
                fresh = _fresh_memory(plan.size) if group.buffer == "fresh" else None
                buf = np.frombuffer(fresh, dtype=np.uint8) if fresh is not None else self.buf
                if run == 0 and fresh is None and plan.size:
                    clear_windows(buf, plan.size)  # (a fresh buffer is zeros, and must stay untouched)
                seconds = time_seq_read(
                    tool, data, buf, plan.size, task_size=plan.task_size, cold=group.cache == "cold"
                )
                if run == 0:
                    check_read(tool, data, buf, plan.size)
                del buf
                if fresh is not None:
                    fresh.close()
                record["seconds"].append(seconds)
            elif group.mode == "write":
                seconds = time_seq_write(tool, self.files.write_path, self.buf, plan.size, task_size=plan.task_size)
                if run == 0:
                    self._check_written(tool)
                record["seconds"].append(seconds)
            else:
                assert group.io_size is not None
                offsets = random_offsets(plan.size, group.io_size, plan.random_ops, plan.seed + run)
                latencies = time_random_reads(
                    tool, data, self.buf, group.io_size, offsets, task_size=plan.task_size, cold=group.cache == "cold"
                )
                if tool.fills_buffer:
                    last = int(offsets[-1])
                    got = self.target.to_numpy(self.buf, 0, group.io_size).tobytes()
                    if got != expected_bytes(data, last, group.io_size):
                        raise BenchError(f"{tool.label} delivered wrong bytes for the random read at offset {last}")
                record["seconds"].append(sum(latencies))
                samples.append(latencies)

    def _check_written(self, tool: Tool) -> None:
        assert self.files is not None
        size = self.plan.size
        if os.path.getsize(self.files.write_path) != size:
            raise BenchError(f"{tool.label} left a file of {os.path.getsize(self.files.write_path)} bytes, not {size}")
        window = min(64 << 10, size)
        for start in sorted({0, size // 2, size - window}):
            start = min(start, size - window)
            if expected_bytes(self.files.write_path, start, window) != expected_bytes(
                self.files.data_path, start, window
            ):
                raise BenchError(f"{tool.label} wrote wrong bytes at offsets {start}..{start + window}")

    def _warmup(self, tool: Tool, group: Group) -> None:
        assert self.files is not None
        with tool.configured():
            if group.mode == "read":
                time_seq_read(tool, self.files.data_path, self.buf, self.plan.size, task_size=self.plan.task_size)
            elif group.mode == "randread":
                assert group.io_size is not None
                offsets = random_offsets(self.plan.size, group.io_size, _WARMUP_RANDOM_OPS, self.plan.seed + 1_000_003)
                time_random_reads(
                    tool, self.files.data_path, self.buf, group.io_size, offsets, task_size=self.plan.task_size
                )

    def _finish(self, record: dict, samples: list) -> dict:
        seconds = record["seconds"]
        record["gb_per_s"] = spread(record["bytes"] / s / GB for s in seconds)
        if samples:
            per_run = [sorted(run) for run in samples]
            record["ops"] = self.plan.random_ops
            record["latency_us"] = {
                "p50": spread(percentile(run, 50) * 1e6 for run in per_run),
                "p99": spread(percentile(run, 99) * 1e6 for run in per_run),
                "mean": spread(sum(run) / len(run) * 1e6 for run in per_run),
            }
            record["iops"] = spread(len(run) / sum(run) for run in per_run)
        record["seconds"] = [round(s, 9) for s in seconds]
        return record

    def _measure_group(self, group: Group, steps: _Steps, ceiling_jobs: list, ceiling_runs: dict) -> list[dict]:
        """The tools' runs of ``group``, round by round; after each round, one run
        of each of ``ceiling_jobs`` (appended to ``ceiling_runs[job index]``)."""
        plan = self.plan
        assert self.files is not None
        tools = [tool for tool in self.tools if group.mode in tool.modes]
        # A fresh-buffer group follows the hot group, whose warm-up it shares.
        if group.cache == "hot" and group.buffer != "fresh":
            steps.start(f"{group.label}: warming up")
            warm_cache(self.files.data_path)
            for tool in tools:
                if tool.name in self.failed:
                    continue
                try:
                    self._warmup(tool, group)
                except Exception as exc:
                    if tool.name == "gdscp":
                        raise
                    self._baseline_failed(tool, group, exc)
            steps.finish()
        if group.mode == "write":
            self._load_buffer()
        records = [self._record(tool, group) for tool in tools]
        samples: list[list] = [[] for _ in tools]

        def tool_run(tool: Tool, record: dict, tool_samples: list, run: int) -> None:
            steps.start(f"{group.label}: {tool.label}, run {run + 1}/{plan.runs}")
            if tool.name not in self.failed:
                try:
                    self._one_run(tool, group, run, record, tool_samples)
                except Exception as exc:
                    if tool.name == "gdscp":
                        raise
                    self._baseline_failed(tool, group, exc)
            steps.finish()

        def ceiling_run(index: int, job: Callable[[int], dict], description: str, run: int) -> None:
            steps.start(f"{group.label}: ceiling: {description}, run {run + 1}/{plan.runs}")
            ceiling_runs.setdefault(index, []).append(job(1))
            steps.finish()

        # Each round starts one place further along the list of tools and
        # ceilings, so that none always runs first or last: on a disk whose
        # rate drifts within a round (a cache below the machine warming up),
        # a fixed order would favour whoever ran at the same point each time.
        order = [functools.partial(tool_run, *each) for each in zip(tools, records, samples)]
        order += [functools.partial(ceiling_run, i, job, d) for i, (_, job, d, _) in ceiling_jobs]
        for run in range(plan.runs):
            shift = run % len(order) if order else 0
            for step in order[shift:] + order[:shift]:
                step(run)
        return [self._finish(record, s) for record, s in zip(records, samples) if record["tool"] not in self.failed]

    def _baseline_failed(self, tool: Tool, group: Group, exc: Exception) -> None:
        """A baseline that breaks (KvikIO without a usable CUDA driver, numpy out of
        memory) leaves the comparison, with the reason; gdscp's figures stand."""
        reason = f"failed in {group.label} ({tool.label}): {type(exc).__name__}: {exc}"
        self.failed[tool.name] = reason
        self.baselines[tool.name] = {"available": False, "reason": reason}
        self._warn(f"{tool.name} baseline dropped: {reason}")

    # -- the whole run ---------------------------------------------------------------
    def run(self) -> dict:
        plan = self.plan
        began = time.perf_counter()
        date = now_iso()
        for message in plan.warnings:
            self._warn(message)
        with contextlib.ExitStack() as stack:
            self.target = stack.enter_context(make_target(plan.memory, plan.device or 0))
            self.buf = self.target.empty(plan.size)
            self.host = self.buf if self.target.kind == "host" else np.empty(plan.size, dtype=np.uint8)
            self._make_tools()
            groups = groups_for(plan)
            jobs = list(enumerate(self._ceiling_jobs()))

            def bounded_by(group: Group) -> list:
                """The ceiling jobs measured between ``group``'s rounds: those of
                its measurement, beside the touched-buffer group only."""
                if group.buffer == "fresh":
                    return []
                return [(i, job) for i, job in jobs if job[3] == (group.mode, group.cache)]

            measured_in = {(g.mode, g.cache) for g in groups}
            upfront = [(i, job) for i, job in jobs if job[3] not in measured_in]
            # One step for the file, one per ceiling measured up front, one
            # warm-up per hot group (a fresh-buffer group shares the hot one's),
            # one per timed run of each tool and of each ceiling interleaved
            # with the group.
            total = 1 + len(upfront)
            for g in groups:
                tools = sum(g.mode in tool.modes for tool in self.tools)
                total += (g.cache == "hot" and g.buffer != "fresh") + plan.runs * (tools + len(bounded_by(g)))
            steps = _Steps(total, self._progress)

            steps.start(f"writing a {_size_text(plan.size)} test file in {plan.dir}")
            self.files = stack.enter_context(BenchFiles(plan.dir, plan.size, plan.seed))
            self._load_buffer()
            steps.finish()
            gdscp_info = self._gdscp_info()
            if plan.drop_cache:
                self.cache_drop = drop_cache(self.files.data_path)

            ceiling_runs: dict[int, list[dict]] = {}
            for index, (_, job, description, _) in upfront:
                steps.start(f"ceiling: {description}")
                ceiling_runs[index] = [job(plan.runs)]
                steps.finish()

            results: list[dict] = []
            for group in groups:
                results.extend(self._measure_group(group, steps, bounded_by(group), ceiling_runs))

            ceilings = self._ceilings_skipped()
            measured: dict[str, list[dict]] = {}
            for index, (name, _, _, _) in jobs:
                if index in ceiling_runs:
                    measured.setdefault(name, []).append(self._merge_runs(ceiling_runs[index]))
            for name, entries in measured.items():
                ceilings[name] = self._merge_by_threads(entries)
            results = [r for r in results if r["tool"] not in self.failed]
            steps.end()

        document = {
            "schema": SCHEMA,
            "date": date,
            "duration_s": round(time.perf_counter() - began, 3),
            "machine": describe_machine(plan.dir, plan.device),
            "gdscp": gdscp_info,
            "config": plan.to_dict(),
            "cache_drop": self.cache_drop,
            "baselines": self.baselines,
            "ceilings": {name: ceilings[name] for name in ceil.CEILING_NAMES if name in ceilings},
            "results": results,
        }
        report.compare(document)
        return document


def _library_task_size(tool: Tool) -> Optional[int]:
    try:
        if tool.name == "gdscp":
            import gdscp

            return int(gdscp.defaults.get("task_size"))
        import kvikio.defaults

        if hasattr(kvikio.defaults, "get"):  # task_size() warns from KvikIO 25.04 on
            return int(kvikio.defaults.get("task_size"))
        return int(kvikio.defaults.task_size())
    except Exception:
        return None


def run_benchmark(
    config: BenchConfig,
    progress: Optional[Progress] = None,
    warn: Optional[Callable[[str], None]] = None,
) -> dict:
    """Run the benchmark ``config`` describes; the JSON-ready result (see
    docs/benchmark-json.md). Raises ``BenchConfigError`` for a bad setting
    before anything is written. The temporary files are removed whatever happens."""
    return Benchmark(resolve(config), progress, warn).run()
