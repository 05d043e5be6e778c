"""The many-files workload (``gdscp benchmark --files N --file-size 1K-64K``):
a tree of files copied by ``gdscp copy -r`` against ``cp -r`` followed by
``sync``, and read into memory by gdscp's bulk read against per-file loops
(plain Python and, where it is importable, ``kvikio.CuFile(path).read(buf)``
at its best thread count). Everything is measured in the same run,
interleaved run by run, and the median of the runs compared.

Both copies run as commands, each in its own process (``python -m gdscp``,
its interpreter's start included, and ``cp``), and both end with their data
on stable storage: gdscp fsyncs by itself, ``cp`` is followed by ``sync``.
Reads are timed inside this process, the files hot in the page cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import memory
from . import ceilings as ceil
from .config import (BenchConfig, BenchConfigError, _choose_memory, check_dir, check_runs, check_threads,
                     default_threads, usable_cores)
from .files import allocation_unit, available_memory, free_disk, scratch_dir
from .machine import describe_machine, now_iso
from .measure import BenchError
from .stats import rated, spread
from .targets import make_target
from .tools import kvikio_status
from .tree import FILES_PER_DIR, Tree, make_tree

__all__ = ["FILE_MODES", "FilesConfig", "SCHEMA", "run_files_benchmark"]

SCHEMA = "gdscp-benchmark-files/1"
FILE_MODES = ("copy", "read")
_MAX_FILES = 10_000_000
# Trees of at most this many files have each run's copies removed after it
# (see the copy workload).
_REUSE_BLOCKS_FILES = 64
# The disk write ceilings write a file of the tree's size, but at least this.
_CEILING_MIN = 1 << 20
# --ranks starts every rank on this machine, each a Python process with its
# own workers: past a few per core they only take turns (and memory), and a
# slip ("--ranks 40000" for 4) would start processes until the machine gives out.
RANKS_PER_CORE = 4


@dataclass
class FilesConfig:
    """The workload's inputs: ``files`` files of ``low``..``high`` bytes each."""

    files: int
    low: int
    high: int
    modes: Sequence[str] = FILE_MODES
    runs: int = 3
    dir: str = "."
    memory: str = "auto"  # "auto", "gpu" or "host", as BenchConfig
    device: int = 0
    threads: Optional[Sequence[int]] = None  # KvikIO's loop is measured at each
    seed: int = 0
    ceilings: bool = True
    ranks: Optional[int] = None  # copy: also as one job over this many MPI ranks (mpiexec -n RANKS)


def _check(config: FilesConfig) -> Optional[list[int]]:
    """Refuses a setting it cannot run (``BenchConfigError`` naming it), and
    leaves each mode once in ``config.modes``; the thread counts asked for,
    each once and in order (None where none were)."""
    if not isinstance(config.files, int) or not 1 <= config.files <= _MAX_FILES:
        raise BenchConfigError("files", f"{config.files!r}: the file count must be between 1 and {_MAX_FILES}")
    if config.low < 0 or config.high < config.low:
        raise BenchConfigError("file_size", f"{config.low}-{config.high}: not a range of sizes")
    for mode in config.modes:
        if mode not in FILE_MODES:
            raise BenchConfigError("mode", f"unknown mode {mode!r} with --files (choose from {', '.join(FILE_MODES)})")
    if not config.modes:
        raise BenchConfigError("mode", f"needs at least one mode ({', '.join(FILE_MODES)})")
    config.modes = list(dict.fromkeys(config.modes))  # each once, in order, as the one-file workload's
    check_runs(config.runs)
    threads = None if config.threads is None else sorted(check_threads(config.threads))
    if config.ranks is not None:
        if config.ranks < 2:
            raise BenchConfigError("ranks", f"{config.ranks}: one job over MPI ranks needs at least 2")
        cores = usable_cores()
        if config.ranks > RANKS_PER_CORE * cores:
            raise BenchConfigError("ranks", f"{config.ranks}: at most {RANKS_PER_CORE * cores} ranks start on this "
                                            f"machine ({RANKS_PER_CORE} per usable core, {cores} "
                                            f"core{'s' if cores != 1 else ''})")
        if "copy" not in config.modes:
            raise BenchConfigError("ranks", "times the copy over MPI ranks: it needs --mode copy")
        _mpiexec()
    directory = check_dir(config.dir)
    # Every file the run writes, as if none were removed before the end, in
    # the filesystem's allocation units: a file takes whole ones (a file of
    # one byte, a whole one), so many small files take far more than their
    # bytes. Each directory of the tree (its root and one per FILES_PER_DIR
    # files, as make_tree lays it out; each copy has the same) takes at least
    # one more (at 4 KiB, its hundred names fit in one). Inodes are not
    # counted: ext4 sets their room aside when it is made, outside the free
    # space; elsewhere a full disk is still said by the run's writes.
    unit = allocation_unit(directory)

    def stored(nbytes: int) -> int:
        return -(-nbytes // unit) * unit

    folders = 1 + max(1, -(-config.files // FILES_PER_DIR))
    tree = config.files * stored(config.high) + folders * unit
    need = tree
    what = ["the tree"]
    if "copy" in config.modes:
        # Every run's copy by each tool (gdscp, cp, and with --ranks gdscp over the ranks).
        need += (3 if config.ranks else 2) * config.runs * tree
        what.append("its copies")
        if config.ceilings:
            need += stored(max(config.files * config.high, _CEILING_MIN))
            what.append("the write ceilings' file")
    if "read" in config.modes:
        need += stored(config.files * config.high)  # the same bytes as one file, the reference of the read
        what.append("one file of its bytes")
    free = free_disk(directory)
    if free is not None and need > free:
        listed = ", ".join(what[:-1]) + " and " + what[-1] if len(what) > 1 else what[0]
        raise BenchConfigError("files", f"{listed} need up to {need} bytes; {directory} has {free} free")
    if "read" in config.modes:
        # Reading the tree back: one buffer for all its bytes, checked through
        # a copy of them (and, for a GPU, a host copy first).
        held = (2 if config.memory == "host" else 3) * config.files * config.high
        available = available_memory()
        if held > available * 0.8:
            raise BenchConfigError("files", f"reading the tree back needs up to {held} bytes of host memory; "
                                            f"{available} are available")
    return threads


def _mpiexec() -> str:
    """The launcher for --ranks: the one beside this interpreter (the mpich wheel's), else on PATH."""
    try:
        import mpi4py  # noqa: F401, PLC0415
    except ImportError:
        raise BenchConfigError("ranks", "needs mpi4py (pip install 'gdscp[mpi]')") from None
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.access(here, os.X_OK) else shutil.which("mpiexec")
    if not found:
        raise BenchConfigError("ranks", "needs an mpiexec (pip install mpich, or the system's MPI)")
    return found


def _unbound(mpiexec: str) -> list[str]:
    """The options that start ``mpiexec``'s ranks unbound, each free to run
    its workers on every core (docs/cluster.md, "Threads"): Open MPI binds
    each of at most two ranks to one core, where its workers would take
    turns and the ranks be timed at a fraction of their speed. Open MPI's
    launcher (and PRRTE's) and MPICH's Hydra both take ``--bind-to none``
    (Hydra's default, said so that a site's HYDRA_BINDING does not bind
    them); another launcher, whose options are its own, gets none."""
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    version = done.stdout + done.stderr
    if any(name in version for name in ("Open MPI", "OpenRTE", "PRRTE", "HYDRA build details")):
        return ["--bind-to", "none"]
    return []


def _digest(paths: Sequence[str]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _record(tool: str, what: str, nbytes: int, seconds: list[float], **extra: Any) -> dict:
    """A tool's runs; every figure from the same seconds, to the nanosecond
    (as the one-file document's), so that the figures agree with each other."""
    rounded, rate = rated(nbytes, seconds)
    return {
        "tool": tool,
        "what": what,
        "bytes": nbytes,
        "seconds": rounded,
        "median_s": round(float(np.median(rounded)), 9),
        "gb_per_s": rate,
        **extra,
    }


def _failure(done: subprocess.CompletedProcess) -> str:
    """Why a copy command failed, in one line: the error of its JSON document
    (gdscp's), else the last line it wrote on stderr."""
    try:
        error = json.loads(done.stdout).get("error")
    except (ValueError, TypeError, AttributeError):
        error = None
    if isinstance(error, str) and error.strip():
        return " ".join(error.split())
    lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
    return lines[-1] if lines else "nothing said"


class _Run:
    def __init__(self, config: FilesConfig, progress: Optional[Callable[[int, int, str], None]],
                 warn: Callable[[str], None]):
        self.config = config
        self.progress = progress
        self.warn = warn
        self.step = 0
        self.total_steps = 0

    def tick(self, description: str) -> None:
        if self.progress is not None:
            self.progress(self.step, self.total_steps, description)
        self.step += 1

    # -- copy ----------------------------------------------------------------------
    def copy(self, tree: Tree, scratch: str, device: int) -> dict:
        import gdscp

        config = self.config
        # gdscp copy as it is run: through a GPU only where one was asked for.
        memory = "gpu" if config.memory == "gpu" else "host"
        place = {"gpu": ["--device", str(device)], "host": ["--host"]}.get(config.memory, [])
        gdscp_argv = [sys.executable, "-m", "gdscp", "copy", "-r", "-q", "--json", *place, tree.root]
        cp_argv = ["cp", "-r", tree.root]
        tools = ["gdscp", "cp"]
        mpi_argv: list[str] = []
        launcher: list[str] = []  # how the ranks are started, as the record says it
        if config.ranks:
            tools.append("gdscp-mpi")
            mpiexec = _mpiexec()
            launcher = ["-n", str(config.ranks), *_unbound(mpiexec)]
            mpi_argv = [mpiexec, *launcher, sys.executable, "-m", "gdscp", "copy", "-r", "-q", "--json", *place,
                        tree.root]
        expected = _digest(tree.paths)
        times: dict[str, list[float]] = {tool: [] for tool in tools}
        command_seconds: dict[str, list[float]] = {"gdscp": [], "gdscp-mpi": []}
        # The commands run with this process's settings (--task-size, --compat-mode), which the JSON reports.
        env = dict(os.environ, GDSCP_TASK_SIZE=str(gdscp.defaults.get("task_size")),
                   GDSCP_COMPAT_MODE=gdscp.defaults.CompatMode(gdscp.defaults.get("compat_mode")).name)
        # The ranks run as one job, whatever GDSCP_MPI says here: each on its
        # own, they would all copy the whole tree into one destination.
        mpi_env = {k: v for k, v in env.items() if k != "GDSCP_MPI"}
        for run in range(config.runs):
            for tool in tools:
                self.tick(f"copy: {tool}, run {run + 1}/{config.runs}")
                # A new directory each run. A tree's copies are removed only at
                # the end: on ext4, files made right after thousands were
                # deleted pay for it (the inode allocator steps over recently
                # freed inodes). A few large files' copies go after each run:
                # kept, every run writes blocks the disk never held, which a
                # thinly provisioned virtual disk takes at a fraction of its
                # rate once its first gigabytes are spent (1 GiB copies went
                # from 0.6 to 3.1 s from the fourth on, whichever tool ran).
                dst = os.path.join(scratch, f"copy-{tool}-{run}")
                os.sync()  # the last run's writeback is not this run's
                start = time.perf_counter()
                if tool in command_seconds:
                    argv = gdscp_argv if tool == "gdscp" else mpi_argv
                    done = subprocess.run(argv + [dst], capture_output=True, text=True,
                                          env=env if tool == "gdscp" else mpi_env)
                else:
                    done = subprocess.run(cp_argv + [dst], capture_output=True, text=True)
                    if done.returncode == 0:
                        done = subprocess.run(["sync"], capture_output=True, text=True)
                seconds = time.perf_counter() - start
                if done.returncode != 0:
                    raise BenchError(f"{tool} copy failed (exit {done.returncode}): {_failure(done)}")
                times[tool].append(seconds)
                if tool in command_seconds:
                    command_seconds[tool].append(float(json.loads(done.stdout)["seconds"]))
                if run == 0:
                    copied = [os.path.join(dst, os.path.relpath(p, tree.root)) for p in tree.paths]
                    if _digest(copied) != expected:
                        raise BenchError(f"{tool} copy -r produced different bytes")
                if len(tree.paths) <= _REUSE_BLOCKS_FILES:
                    shutil.rmtree(dst, ignore_errors=True)
        for run in range(config.runs):
            for tool in tools:
                shutil.rmtree(os.path.join(scratch, f"copy-{tool}-{run}"), ignore_errors=True)
        nbytes = tree.bytes
        gdscp = _record("gdscp", " ".join(["gdscp", "copy", "-r", *place, "SRC", "DST"]) + " (a new process)",
                        nbytes, times["gdscp"], command_seconds=spread(command_seconds["gdscp"]))
        cp = _record("cp", "cp -r SRC DST; sync", nbytes, times["cp"], best=True)  # the baseline's one record
        gdscp["factor"] = {"cp": round(cp["median_s"] / gdscp["median_s"], 4)}
        results = [gdscp, cp]
        if config.ranks:
            mpi = _record("gdscp-mpi", f"mpiexec {' '.join(launcher)} gdscp copy -r SRC DST (one job over "
                          f"{config.ranks} ranks, each a new process)", nbytes, times["gdscp-mpi"],
                          command_seconds=spread(command_seconds["gdscp-mpi"]), ranks=config.ranks)
            # Above 1: the ranks are faster than one process (the command's own time, and with starts).
            mpi["factor"] = {
                "one_process": round(gdscp["median_s"] / mpi["median_s"], 4),
                "one_process_command": round(gdscp["command_seconds"]["median"] / mpi["command_seconds"]["median"], 4),
            }
            results.append(mpi)
        return {"mode": "copy", "memory": memory, "results": results}

    # -- read ----------------------------------------------------------------------
    def read(self, tree: Tree, target: Any, threads: list[int]) -> dict:
        import gdscp

        config = self.config
        offsets = np.concatenate([[0], np.cumsum(tree.sizes)]).astype(np.int64)
        buf = target.empty(int(offsets[-1]) or 1)
        views = [buf[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:])]
        host = buf if target.kind == "host" else np.empty(int(offsets[-1]) or 1, dtype=np.uint8)
        for path in tree.paths:  # hot: every file in the page cache
            with open(path, "rb") as f:
                f.read()
        expected = _digest(tree.paths)

        def check(tool: str) -> None:
            got = target.to_numpy(buf, 0, int(offsets[-1])) if target.kind == "gpu" else buf[: int(offsets[-1])]
            if hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest() != expected:
                raise BenchError(f"{tool} read wrong bytes")

        def gdscp_read() -> None:
            job = gdscp.read_files(tree.paths, views)
            failed = [r for r in job.results() if r.status != "done"]
            if failed:
                raise BenchError(f"gdscp read failed: {failed[0].error}")

        def python_read() -> None:
            hview = memoryview(host)
            for path, a, b in zip(tree.paths, offsets[:-1], offsets[1:]):
                with open(path, "rb", buffering=0) as f:
                    f.readinto(hview[int(a):int(b)])
            if target.kind == "gpu":
                target.upload(buf, host, int(offsets[-1]))

        # The reference the bulk read is held to: the same bytes as one hot
        # file, read by gdscp into the same buffer.
        one_file = os.path.join(os.path.dirname(os.path.abspath(tree.root)), "one-file.bin")
        with open(one_file, "wb") as out:
            for path in tree.paths:
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out)

        def one_file_read() -> None:
            with gdscp.CuFile(one_file, "r") as f:
                f.read(buf[: int(offsets[-1])])

        contenders: list[tuple[str, Optional[int], Callable[[], None], str]] = [
            ("gdscp", None, gdscp_read, "gdscp.read_files(paths, buffers).results()"),
            ("gdscp-one-file", None, one_file_read, "gdscp.CuFile(one file of the same bytes).read(buf)"),
            ("python", None, python_read, "for each file: open(path, 'rb', buffering=0).readinto(buf[a:b])"
             + (" (host), then one copy to the GPU" if target.kind == "gpu" else "")),
        ]
        configured: dict[tuple[str, Optional[int]], Callable[[], Any]] = {}
        ok, reason, version = kvikio_status()
        kvikio_entry: dict = {"available": ok, "reason": reason, "version": version}
        if ok:
            import kvikio
            import kvikio.defaults

            def kvikio_loop() -> None:
                for path, view in zip(tree.paths, views):
                    f = kvikio.CuFile(path, "r")
                    f.read(view)
                    f.close()

            for count in threads:
                contenders.append(("kvikio", count, kvikio_loop, "for each file: kvikio.CuFile(path).read(buf[a:b])"))
                # Its thread count set outside the clock, as gdscp's is (KvikIO makes its pool then).
                configured[("kvikio", count)] = lambda c=count: kvikio.defaults.set("num_threads", c)
        times: dict[tuple[str, Optional[int]], list[float]] = {(n, t): [] for n, t, _, _ in contenders}
        dropped: set[str] = set()  # baselines that failed: out of the comparison, the others' runs go on
        # Round 0 is an untimed warm-up for every tool (its pools, pinned
        # buffers and threads made); rounds 1..runs are timed.
        for run in range(config.runs + 1):
            for name, count, fn, _ in contenders:
                if name in dropped:
                    continue
                label = "warm-up" if run == 0 else f"run {run}/{config.runs}"
                self.tick(f"read: {name}{'' if count is None else f' ({count} threads)'}, {label}")
                if run == 0 and int(offsets[-1]):
                    # Zeros (the files are random) before the read that check() checks: the
                    # buffer holds the previous tool's bytes, which a tool delivering nothing would keep.
                    memory.fill(buf[: int(offsets[-1])], "zeros")
                with configured.get((name, count), contextlib.nullcontext)():
                    if target.kind == "gpu":
                        target.sync()
                    start = time.perf_counter()
                    try:
                        fn()
                        if target.kind == "gpu":
                            target.sync()
                    except Exception as exc:
                        if name.startswith("gdscp"):  # gdscp's own reads: the run is wrong without them
                            raise
                        self.warn(f"{name} baseline dropped: {type(exc).__name__}: {exc}")
                        dropped.add(name)
                        if name == "kvikio":
                            kvikio_entry = {**kvikio_entry, "available": False,
                                            "reason": f"failed: {type(exc).__name__}: {exc}"}
                        continue
                    elapsed = time.perf_counter() - start
                if run > 0:
                    times[(name, count)].append(elapsed)
                if run == 0:
                    check(name)
        records = []
        for name, count, _, what in contenders:
            if name not in dropped:
                records.append(_record(name, what, tree.bytes, times[(name, count)], threads=count))
        os.unlink(one_file)
        gdscp_rec = records[0]
        one = next(r for r in records if r["tool"] == "gdscp-one-file")
        # Rates over the same bytes: one file's median time over the many files'.
        gdscp_rec["share_of_one_file"] = round(one["median_s"] / gdscp_rec["median_s"], 4)
        gdscp_rec["factor"] = {}
        for name in ("python", "kvikio"):
            peers = [r for r in records if r["tool"] == name]
            if peers:
                best = min(peers, key=lambda r: r["median_s"])
                best["best"] = True
                gdscp_rec["factor"][name] = round(best["median_s"] / gdscp_rec["median_s"], 4)
            else:
                gdscp_rec["factor"][name] = None
        return {"mode": "read", "memory": target.kind, "results": records, "kvikio": kvikio_entry}


def run_files_benchmark(
    config: FilesConfig,
    progress: Optional[Callable[[int, int, str], None]] = None,
    warn: Optional[Callable[[str], None]] = None,
) -> dict:
    """Run the many-files workload; the JSON-ready result (docs/benchmark-json.md,
    "The many-files document"). The tree and the copies are removed whatever happens."""
    threads = _check(config)
    warn = warn or (lambda message: None)
    memory, device, memory_reason = _choose_memory(BenchConfig(memory=config.memory, device=config.device))
    threads = threads if threads is not None else default_threads()[0]
    began = time.perf_counter()
    date = now_iso()
    run = _Run(config, progress, warn)
    kvikio_runs = len(threads) if kvikio_status()[0] else 0
    run.total_steps = 1 + ("copy" in config.modes) * (2 + bool(config.ranks)) * config.runs + ("read" in config.modes) * (
        (3 + kvikio_runs) * (config.runs + 1)) + (2 * config.ceilings * ("copy" in config.modes))
    workloads = []
    ceilings: dict = {}
    with scratch_dir(config.dir, ".gdscp-bench-files-") as scratch:
        run.tick(f"writing {config.files} files in {config.dir}")
        tree = make_tree(os.path.join(scratch, "tree"), config.files, config.low, config.high, config.seed)
        if "copy" in config.modes:
            if config.ceilings:
                probe = os.path.join(scratch, "ceiling.bin")
                size = max(tree.bytes, _CEILING_MIN)
                run.tick("ceiling: disk O_DIRECT write")
                ceilings["disk_direct_write"] = ceil.direct_write_rate(probe, size, max(threads), config.runs)
                run.tick("ceiling: disk buffered write")
                ceilings["disk_buffered_write"] = ceil.buffered_write_rate(probe, size, config.runs)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(probe)
            copy = run.copy(tree, scratch, device or 0)
            usable = [c["gb_per_s"]["median"] for c in ceilings.values() if c.get("available")]
            if usable:
                top = max(usable)
                for record in copy["results"]:
                    record["share_of_ceiling"] = round(record["gb_per_s"]["median"] / top, 4)
                copy["ceiling_gb_per_s"] = top
            workloads.append(copy)
        if "read" in config.modes:
            with make_target(memory, device or 0) as target:
                workloads.append(run.read(tree, target, threads))
        if run.progress is not None:
            run.progress(run.total_steps, run.total_steps, "done")
    import gdscp

    return {
        "schema": SCHEMA,
        "date": date,
        "duration_s": round(time.perf_counter() - began, 3),
        "machine": describe_machine(os.path.abspath(config.dir), device),
        "gdscp": {"version": gdscp.__version__, "settings": gdscp.defaults.current()},
        "config": {**asdict(config), "dir": os.path.abspath(config.dir), "memory": memory,
                   "memory_reason": memory_reason, "device": device, "threads": threads,
                   "bytes": tree.bytes, "modes": list(config.modes)},
        "ceilings": ceilings,
        "workloads": workloads,
    }
