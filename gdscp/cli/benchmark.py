"""``gdscp benchmark``: how fast this machine moves files into GPU (or host)
memory with gdscp, next to plain Python, numpy + CuPy, KvikIO and the
machine's own ceilings; with ``--files``, a tree of many files copied and
read (against ``cp -r`` + ``sync`` and per-file loops). The measuring lives in
``gdscp.bench``; this module parses options, shows progress and prints the
table, the JSON or the plot."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich import box
from rich.console import Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .._sizes import parse_integer
from ..bench.config import DEFAULT_RANDOM_OPS, DEFAULT_RUNS, MODES, BenchConfig, BenchConfigError, check_task_size
from ..bench.many import FILE_MODES, FilesConfig, run_files_benchmark
from ..bench.measure import BenchError
from ..bench.tree import parse_size_range
from ..bench.plot import PLOT_SUFFIXES, PlotUnavailable, plot, require_matplotlib
from ..bench.runner import run_benchmark
from . import options
from .ranks import launched as launched_by_mpi
from .exits import EXIT_FAILURE, STDOUT_CLOSED
from .output import Failure, Output, UsageError, describe, shown
from .units import format_bytes, parse_size

__all__ = ["benchmark"]

_MEASURE = "Measurement"
_OPTION_NAMES = {"random_ops": "--ops"}  # the rest are "--" + the name with dashes
_DEFAULT_FILE_SIZE = "1K-64K"
_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}
_TOOL_NAMES = {"gdscp": "gdscp", "python": "python", "numpy_cupy": "numpy+cupy", "kvikio": "kvikio",
               "preadv": "os.preadv"}


def _list(option: str, text: str, parse: Callable[[str], Any]) -> list:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"{option}: expected a comma-separated list, got '{text}'")
    values = []
    for item in items:
        try:
            values.append(parse(item))
        except ValueError as exc:
            raise UsageError(f"{option}: {exc}") from None
    return values


def _size(option: str, text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _task_size(task_size: Optional[int]) -> Optional[int]:
    """--task-size, if within the bounds the one-file workload holds it to
    (``check_task_size``); for the workloads that set it as gdscp's setting."""
    if task_size is None:
        return None
    try:
        return check_task_size(task_size)
    except BenchConfigError as exc:
        raise UsageError(f"--task-size: {exc}") from None


def _dir_option(text: str) -> Path:
    """Typer ``parser=`` for --dir: an empty one (``--dir "$UNSET"``) is refused,
    not taken for the current directory, where Path("") would lead."""
    if not str(text):
        raise typer.BadParameter("must not be empty")
    return Path(text)


def _plot_option(text: str) -> Path:
    """Typer ``parser=`` for --plot: an empty name is refused, not taken for
    the current directory, where Path("") would lead."""
    if not str(text):
        raise typer.BadParameter("must not be empty")
    return Path(text)


def _check_plot(path: Optional[Path]) -> None:
    """A --plot file that could not be written is refused now, before the
    run: found only once the run is over, it would cost the whole run."""
    if path is None:
        return
    if path.name.lower() in PLOT_SUFFIXES:  # ".png": a hidden file's name, with no suffix of its own
        raise UsageError(f"--plot: '{path}' has no name before its suffix (as in figure{path.name})")
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot: '{path}' must end in {', '.join(PLOT_SUFFIXES)}")
    parent = path.parent
    if not parent.is_dir():
        # The nearest of its directories that exists: a file there is the trouble.
        found = next((p for p in (parent, *parent.parents) if p.exists()), None)
        if found is not None and not found.is_dir():
            raise UsageError(f"--plot: '{found}' is not a directory")
        raise UsageError(f"--plot: directory '{parent}' does not exist")
    if path.is_dir():
        raise UsageError(f"--plot: '{path}' is a directory")
    try:
        # Where the picture lands: through a symbolic link, as it is saved.
        target = os.path.realpath(path)
    except OSError as exc:  # a relative name, from a working directory that was removed
        raise UsageError(f"--plot: '{path}': cannot find the current working directory ({exc.strerror})") from None
    where = target if os.path.exists(target) else os.path.dirname(target)
    if not os.path.exists(where):  # a symbolic link to a name in no directory
        raise UsageError(f"--plot: '{path}' leads to '{target}', whose directory does not exist")
    if not os.access(where, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        try:
            read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        raise UsageError(f"--plot: cannot write '{path}': {os.strerror(errno.EROFS if read_only else errno.EACCES)}")
    try:
        require_matplotlib()
    except PlotUnavailable as exc:
        raise UsageError(str(exc)) from None


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _times(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _num(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _size_label(n: Optional[int], places: int = 2) -> str:
    """``"1 KiB"``, ``"1.50 KiB"``; with more ``places``, without their trailing zeros (``"1.001 KiB"``)."""
    if n is None:
        return ""
    if places == 2:
        return format_bytes(n).replace(".00 ", " ")
    number, _, unit = format_bytes(n, places).partition(" ")
    return f"{number.rstrip('0').rstrip('.') if '.' in number else number} {unit}"


def _size_range(low: int, high: int) -> str:
    """``"1 KiB-2 KiB"``, or one label where the sizes are one. Two sizes
    that their labels would round together (1024 and 1025 bytes) get the
    decimals that tell them apart (``"1 KiB-1.001 KiB"``), or past six,
    their exact counts."""
    if low == high:
        return _size_label(low)
    for places in range(2, 7):
        first, last = _size_label(low, places), _size_label(high, places)
        if first != last:
            return f"{first}-{last}"
    return f"{low} B-{high} B"


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)


def _compared(doc: dict) -> list[str]:
    return [b for b in ("python", "numpy_cupy", "kvikio", "preadv") if doc["baselines"].get(b, {}).get("available")]


def _fill(table: Table, records: list[dict], cells: Callable[[dict, bool], list[str]]) -> Table:
    previous = None
    for r in records:
        key = (r["mode"], r["cache"], r["io_size"], r.get("buffer"))
        if previous is not None and key != previous:
            table.add_section()
        table.add_row(*cells(r, key != previous), style="bold" if r["tool"] == "gdscp" else None)
        previous = key
    return table


def _factors(doc: dict, r: dict) -> list[str]:
    factor = r.get("factor", {})
    return [_times(factor.get(b)) if r["tool"] == "gdscp" else "" for b in _compared(doc)]


def _sequential_table(doc: dict, records: list[dict]) -> Table:
    table = _table(f"sequential: GB/s, median of {doc['config']['runs']} runs (min-max)")
    for name in ("test", "tool", "threads", "GB/s", "min-max", "of ceiling"):
        table.add_column(name, justify="left" if name in ("test", "tool") else "right")
    for b in _compared(doc):
        table.add_column(f"x {_TOOL_NAMES[b]}", justify="right")

    def cells(r: dict, first: bool) -> list[str]:
        g = r["gb_per_s"]
        return [
            (r["mode"] + (f" {r['cache']}" if r["cache"] else "") + (" fresh" if r.get("buffer") == "fresh" else ""))
            if first
            else "",
            _TOOL_NAMES[r["tool"]],
            "-" if r["threads"] is None else str(r["threads"]),
            _num(g["median"]),
            f"{_num(g['min'])}-{_num(g['max'])}",
            _pct(r.get("share_of_ceiling")),
        ] + _factors(doc, r)

    return _fill(table, records, cells)


def _random_table(doc: dict, records: list[dict]) -> Table:
    config = doc["config"]
    table = _table(f"random reads, one at a time, {config['random_ops']} per run: median of {config['runs']} runs")
    for name in ("size", "tool", "threads", "p50 us", "p99 us", "IOPS", "GB/s"):
        table.add_column(name, justify="left" if name in ("size", "tool") else "right")
    for b in _compared(doc):
        table.add_column(f"x {_TOOL_NAMES[b]}", justify="right")

    def cells(r: dict, first: bool) -> list[str]:
        p50, p99 = r["latency_us"]["p50"]["median"], r["latency_us"]["p99"]["median"]
        return [
            f"{_size_label(r['io_size'])} {r['cache']}" if first else "",
            _TOOL_NAMES[r["tool"]],
            "-" if r["threads"] is None else str(r["threads"]),
            f"{p50:.1f}" if p50 < 10 else f"{p50:.0f}",
            f"{p99:.1f}" if p99 < 10 else f"{p99:.0f}",
            f"{r['iops']['median']:.0f}",
            _num(r["gb_per_s"]["median"]),
        ] + _factors(doc, r)

    return _fill(table, records, cells)


def _ceilings_table(doc: dict) -> Table:
    table = _table("the machine's ceilings, measured in this run")
    table.add_column("ceiling")
    table.add_column("GB/s", justify="right")
    table.add_column("min-max", justify="right")
    table.add_column("how")
    for name, entry in doc["ceilings"].items():
        if entry.get("applies") is False:
            continue
        if entry.get("available"):
            g = entry["gb_per_s"]
            table.add_row(name, _num(g["median"]), f"{_num(g['min'])}-{_num(g['max'])}", entry["what"])
        else:
            table.add_row(name, "-", "", f"not measured: {entry['reason']}", style="dim")
    return table


def _headline(doc: dict) -> str:
    config, machine = doc["config"], doc["machine"]
    fs = machine["filesystem"]
    where = f"GPU {config['device']}" if config["memory"] == "gpu" else "host memory"
    gpu = machine["gpu"]
    if config["memory"] == "gpu" and gpu.get("devices"):
        where += f" ({gpu['devices'][config['device']]['name']})"
    lines = [
        f"gdscp benchmark: a {_size_label(config['size'])} file in {shown(fs['dir'])} ({fs.get('type', '?')} on "
        f"{shown(fs.get('source') or '?')}) into {where}; gdscp {doc['gdscp']['version']}, "
        f"{doc['gdscp']['backend']} backend; took {doc['duration_s']:.0f} s"
    ]
    for name, entry in doc["baselines"].items():
        if not entry.get("available") and not (name == "numpy_cupy" and config["memory"] == "host"):
            lines.append(f"not compared with {_TOOL_NAMES[name]}: {entry['reason']}")
    return "\n".join(lines)


def _render(doc: dict) -> Group:
    parts: list[Any] = [_headline(doc)]
    sequential = [r for r in doc["results"] if r["mode"] != "randread"]
    random = [r for r in doc["results"] if r["mode"] == "randread"]
    if sequential:
        parts += ["", _sequential_table(doc, sequential)]
    if random:
        parts += ["", _random_table(doc, random)]
    parts += ["", _ceilings_table(doc)]
    parts.append(_legend(doc))
    return Group(*parts)


_RATIO_MEANING = {
    "python": "plain Python: open(..., buffering=0).readinto() or .write() (+ os.fsync), one thread",
    "numpy_cupy": "numpy.fromfile then cupy.asarray (writes: cupy.asnumpy then tofile)",
    "kvikio": "KvikIO at the same thread count",
    "preadv": "a bare os.preadv into the same buffer",
}


def _legend(doc: dict) -> str:
    """What every column and word of the tables means, for the columns shown."""
    lines = [
        "GB/s: 10^9 bytes per second, median of the runs (min-max beside it). "
        "hot: the file is in the page cache; cold: its cached pages are dropped before every run; "
        "fresh: into new memory each run (as a large numpy.empty), never touched before.",
        "of ceiling: the figure over the machine's own limit for that test (the last table), "
        "measured in this run without gdscp.",
    ]
    for name in _compared(doc):
        lines.append(
            f"x {_TOOL_NAMES[name]}: how many times faster gdscp is than {_RATIO_MEANING[name]} "
            "(GB/s; for random reads, p50 latency)."
        )
    if doc["config"]["memory"] == "host":
        lines.append(
            "This run used host memory: the figures are how fast gdscp moves files to and from "
            "numpy arrays on this machine; with a GPU they would pass through GPU memory."
        )
    return "\n".join(lines)


def _files_render(doc: dict) -> Group:
    config = doc["config"]
    where = "host memory" if config["memory"] == "host" else f"GPU {config['device']}"
    sizes = _size_range(config["low"], config["high"])
    parts: list[Any] = [
        f"gdscp benchmark: {config['files']} files of {sizes} "
        f"({_size_label(config['bytes'])} in all) in {shown(config['dir'])}, through {where}; median of "
        f"{config['runs']} runs; took {doc['duration_s']:.0f} s"
    ]
    for work in doc["workloads"]:
        how = " without a GPU" if work["mode"] == "copy" and work["memory"] == "host" else ""
        table = _table(f"{work['mode']}{how}: seconds, median of {config['runs']} runs (min-max GB/s)")
        for name in ("tool", "threads", "seconds", "GB/s", "min-max", "x gdscp faster"):
            table.add_column(name, justify="left" if name == "tool" else "right")
        gdscp = work["results"][0]
        for r in work["results"]:
            g = r["gb_per_s"]
            faster = ""
            if r["tool"] != "gdscp" and (r.get("best") or r["tool"] in ("cp", "gdscp-mpi")):
                faster = _times(r["median_s"] / gdscp["median_s"])
            table.add_row(
                r["tool"], "-" if r.get("threads") is None else str(r["threads"]), f"{r['median_s']:.3f}",
                _num(g["median"]), f"{_num(g['min'])}-{_num(g['max'])}", faster,
                style="bold" if r["tool"] == "gdscp" else None,
            )
        parts += ["", table]
        for r in work["results"]:
            parts.append(f"  {r['tool']}: {r['what']}")
        if work["mode"] == "copy":
            cs = gdscp["command_seconds"]["median"]
            parts.append(f"  gdscp copy's own time (without starting Python): {cs:.3f} s")
            for r in work["results"]:
                if r["tool"] == "gdscp-mpi":
                    ms = r["command_seconds"]["median"]
                    parts.append(f"  the same over {r['ranks']} ranks: {ms:.3f} s; {r['ranks']} ranks reach "
                                 f"{_times(r['factor']['one_process_command'])} one process's speed "
                                 f"({_times(r['factor']['one_process'])} with the processes' starts)")
            if "ceiling_gb_per_s" in work:
                parts.append(f"  disk write ceiling measured in this run: {_num(work['ceiling_gb_per_s'])} GB/s; "
                             f"gdscp at {_pct(gdscp.get('share_of_ceiling'))} of it")
        else:
            if "share_of_one_file" in gdscp:
                parts.append(f"  the files read at {_pct(gdscp['share_of_one_file'])} of the rate of one file of "
                             "the same bytes (gdscp-one-file)")
            if not work["kvikio"]["available"]:
                parts.append(f"  not compared with kvikio: {work['kvikio']['reason']}")
    return Group(*parts)


class _Bar:
    """The run's steps as one Rich bar on stderr (only for a person watching)."""

    def __init__(self, out: Output):
        self._enabled = out.show_progress
        self._progress: Optional[Progress] = None
        self._task: Any = None
        self._console = out.stderr

    def __call__(self, completed: int, total: int, description: str) -> None:
        if not self._enabled:
            return
        if self._progress is None:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
            )
            self._task = self._progress.add_task(description, total=total)
            self._progress.start()
        self._progress.update(self._task, completed=completed, total=total, description=description)

    def __enter__(self) -> "_Bar":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def benchmark(
    size: Annotated[
        Optional[str],
        typer.Option(
            "--size",
            metavar="SIZE",
            help="Test file size (default: 1GiB; with --devices, 4GiB per GPU; less where disk or memory is short).",
            rich_help_panel=_MEASURE,
        ),
    ] = None,
    mode: Annotated[
        Optional[str],
        typer.Option(
            "--mode",
            metavar="MODES",
            help=f"What to measure, comma-separated: {', '.join(MODES)} (default: all; with --files: "
            f"{','.join(FILE_MODES)}).",
            rich_help_panel=_MEASURE,
        ),
    ] = None,
    threads: Annotated[
        Optional[str],
        typer.Option(
            "--threads",
            metavar="N,N,...",
            help="Thread counts for gdscp and KvikIO (default: 1, 4, gdscp's default and 16 on 16+ cores; "
            "with --devices: gdscp's default and twice the cores, at most 64).",
            rich_help_panel=_MEASURE,
        ),
    ] = None,
    io_size: Annotated[
        Optional[str],
        typer.Option(
            "--io-size",
            metavar="SIZE,...",
            help="Sizes of the random reads (randread), comma-separated (default: those of 4K,64K,1M that fit "
            "the file).",
            rich_help_panel=_MEASURE,
        ),
    ] = None,
    ops: Annotated[
        Optional[int],
        typer.Option(
            "--ops",
            parser=options.whole_number,
            metavar="N",
            help=f"Random reads per run, one at a time (default: {DEFAULT_RANDOM_OPS}; at least 100, for a p99).",
            rich_help_panel=_MEASURE,
        ),
    ] = None,
    runs: Annotated[
        int,
        typer.Option(
            "--runs",
            parser=options.whole_number,
            metavar="N",
            help="Runs of each measurement (at least 3): median, min and max are shown.",
            rich_help_panel=_MEASURE,
        ),
    ] = DEFAULT_RUNS,
    drop_cache: Annotated[
        bool,
        typer.Option(
            "--drop-cache",
            help="Also measure cold reads: drop the file's cached pages before each run "
            "(posix_fadvise; drop_caches as root). Not on tmpfs or ramfs, whose files are only in memory.",
            rich_help_panel=_MEASURE,
        ),
    ] = False,
    directory: Annotated[
        Path,
        typer.Option(
            "--dir",
            parser=_dir_option,
            metavar="DIR",
            help="Where the temporary test files go (removed afterwards).",
            rich_help_panel=_MEASURE,
        ),
    ] = Path("."),
    device: options.Device = None,
    devices: options.Devices = None,
    host: options.Host = False,
    task_size: options.TaskSize = None,
    compat_mode: options.CompatModeOpt = None,
    json: options.Json = False,
    plot_file: Annotated[
        Optional[Path],
        typer.Option(
            "--plot",
            parser=_plot_option,
            metavar="FILE.png",
            help="Also draw GB/s against threads to FILE (.png, .svg or .pdf; needs matplotlib).",
            rich_help_panel="Output",
        ),
    ] = None,
    files: Annotated[
        Optional[int],
        typer.Option(
            "--files",
            parser=options.whole_number,
            metavar="N",
            help="Instead: a tree of N files, copied (gdscp copy -r against cp -r + sync) and read "
            "(gdscp's bulk read against per-file loops: Python, KvikIO); --mode copy,read.",
            rich_help_panel=_MEASURE,
        ),
    ] = None,
    file_size: Annotated[
        Optional[str],
        typer.Option(
            "--file-size",
            metavar="SIZE[-SIZE]",
            help=f"With --files: each file's size, or a range to draw sizes from (default {_DEFAULT_FILE_SIZE}).",
            rich_help_panel=_MEASURE,
        ),
    ] = None,
    ranks: Annotated[
        Optional[int],
        typer.Option(
            "--ranks",
            parser=options.whole_number,
            metavar="N",
            help="With --files and --mode copy: also time the copy as one job over N MPI ranks on this machine "
            "(mpiexec -n N gdscp copy -r; at most 4 per usable core; needs gdscp\\[mpi]).",
            rich_help_panel=_MEASURE,
        ),
    ] = None,
    quiet: options.Quiet = False,
    debug: options.Debug = False,
) -> None:
    """Measure gdscp's reads and writes against plain Python, numpy + CuPy, KvikIO and this machine's limits.

    With no options: a temporary 1 GiB file in the current directory, read
    into the GPU (host memory without one), at several thread counts, three
    runs each. The table gives GB/s, the share of the ceiling (pinned
    host-to-GPU copy for hot reads, the disk for cold reads and writes) and
    how many times faster gdscp is than each baseline.

    With --files N: a tree of N files (--file-size, uniform in a range), copied
    with gdscp copy -r against cp -r followed by sync, and read into memory
    with gdscp's bulk read against a loop over the files (Python, and KvikIO at
    each thread count), with how many times faster gdscp is.

    Example: gdscp benchmark --size 4G --drop-cache --json > bench.json

    With --devices 0,1 (or all): one hot file per GPU loaded into the GPUs
    at once, and one hot file replicated onto every GPU against loading it
    onto one, beside the host-side ceiling (every core reading the page cache
    into pinned memory) and the aggregate pinned PCIe rate, with the ratios
    the multi-GPU targets are stated in (docs/multi-gpu.md).

    Example: gdscp benchmark --files 5000 --file-size 1K-64K

    Example: gdscp benchmark --devices 0,1 --size 4G --json > multi.json
    """
    out = Output("benchmark", json=json, quiet=quiet, debug=debug)
    if launched_by_mpi():
        with out.guard():
            raise UsageError("benchmark measures one process; under an MPI launcher time 'gdscp copy', 'read' or "
                             "'write' with --json instead (docs/cluster.md)")
    # Each None unless given, so that a default value spelled out is refused
    # where it would go unused, as any other value.
    one_file_only = {"--io-size": io_size is not None, "--ops": ops is not None,
                     "--drop-cache": drop_cache, "--plot": plot_file is not None}
    if devices is not None:
        with out.guard(), options.settings(None, _task_size(task_size), compat_mode):
            _ignored("--devices", {**one_file_only, "--mode": mode is not None, "--files": files is not None,
                                   "--file-size": file_size is not None, "--ranks": ranks is not None})
            _multi_benchmark(out, devices, host, device, size, threads, runs, directory)
        return
    if files is not None or file_size is not None:
        with out.guard(), options.settings(None, _task_size(task_size), compat_mode):
            _ignored("--files", {**one_file_only, "--size": size is not None})
            _files_benchmark(out, files, file_size, mode, threads, runs, directory, host, device, json, ranks)
        return
    if ranks is not None:
        with out.guard():
            raise UsageError("--ranks needs --files (it times the tree's copy over MPI ranks)")
    with out.guard(), options.settings(None, None, compat_mode):
        config = BenchConfig(
            size=_size("--size", size),
            modes=list(MODES) if mode is None else _list("--mode", mode, str.strip),
            threads=None if threads is None else _list("--threads", threads, parse_integer),
            task_size=task_size,
            io_sizes=None if io_size is None else _list("--io-size", io_size, parse_size),
            runs=runs,
            random_ops=DEFAULT_RANDOM_OPS if ops is None else ops,
            drop_cache=drop_cache,
            dir=os.fspath(directory),
        )
        # Options that only the random reads, or only the reads, use: refused
        # where --mode leaves those out, as the other workloads refuse theirs.
        modes = set(config.modes)
        _ignored(f"--mode {','.join(config.modes)}", {
            "--io-size": one_file_only["--io-size"] and "randread" not in modes,
            "--ops": one_file_only["--ops"] and "randread" not in modes,
            "--drop-cache": drop_cache and not modes & {"read", "randread"},
        })
        _check_plot(plot_file)
        where = options.choose_memory(out, host, device)
        # "auto" unless memory was named, so that the document says why it measured what it did.
        config.memory = "host" if host else ("gpu" if device is not None else "auto")
        config.device = 0 if where is None else where
        document = _measure(out, run_benchmark, config)
        # The plot before the result, so that the result can say whether it
        # was written; one that fails loses no figures: the document or the
        # table still holds them, with the failure.
        if plot_file is not None:
            try:
                plot(document, os.fspath(plot_file))
            except BaseException as exc:  # noqa: BLE001 - said with the figures, then raised as it is
                message, code = describe(exc)
                if isinstance(exc, Exception):
                    message, code = f"cannot write the plot: {message}", EXIT_FAILURE
                out.result({"command": "benchmark", "ok": False, "error": message, "exit_code": code, **document},
                           lambda: _render(document))
                if isinstance(exc, Exception):
                    raise Failure(message) from None
                raise
        out.result({"command": "benchmark", "ok": True, **document}, lambda: _render(document))
        if plot_file is not None:
            out.note(f"plot written to {plot_file}")


def _multi_benchmark(out: Output, devices: str, host: bool, device: Optional[int], size: Optional[str],
                     threads: Optional[str], runs: int, directory: Path) -> None:
    from ..bench.multi import MultiConfig, run_multi_benchmark  # noqa: PLC0415

    spread = options.choose_devices(host, device, devices)
    assert spread is not None
    if len(spread) < 2:
        raise UsageError(f"--devices {devices}: the multi-GPU benchmark needs at least two GPUs")
    config = MultiConfig(
        devices=spread,
        size=_size("--size", size),
        runs=runs,
        dir=os.fspath(directory),
        threads=None if threads is None else _list("--threads", threads, parse_integer),
    )
    document = _measure(out, run_multi_benchmark, config)
    out.result({"command": "benchmark", "ok": True, **document}, lambda: _multi_render(document))


def _multi_render(doc: dict) -> Group:
    ratios = doc["ratios"]
    table = _table(f"hot files into GPUs {', '.join(map(str, doc['devices']))} ({_size_label(doc['file_size'])} each)")
    for name in ("threads", "one GPU", "replicate", "distinct", "one pool", "of bound", "replicate / one"):
        table.add_column(name, justify="right")
    for threads, r in doc["results"].items():
        q = ratios["by_threads"][threads]
        table.add_row(threads, *(_num(r[k]["gb_per_s"]["median"]) for k in ("one_gpu", "replicate", "distinct",
                                                                           "distinct_one_pool")),
                      _pct(q["distinct_share_of_bound"]), _times(q["replicate_over_one_gpu"]))
    ceilings = _table("ceilings measured in this run")
    ceilings.add_column("ceiling")
    ceilings.add_column("GB/s", justify="right")
    ceilings.add_column("how")
    for name, entry in doc["ceilings"].items():
        if entry.get("available"):
            ceilings.add_row(name, _num(entry["gb_per_s"]["median"]), entry["what"])
        else:
            ceilings.add_row(name, "-", entry.get("reason", ""))
    bound = ratios["bound_gb_per_s"]
    if ratios.get("copies_while_reading_gb_per_s") is not None:
        ceilings.add_row("GPU copies meanwhile", _num(ratios["copies_while_reading_gb_per_s"]),
                         "pinned host -> GPU copies on every GPU while host_page_cache_while_copying read")
    legend = (f"GB/s medians of {doc['runs']} runs. distinct: one file per GPU, spread over the GPUs; one pool: the same "
              f"without --devices; of bound: distinct over min(host side, aggregate PCIe) = "
              f"{_num(bound) if bound else '-'} GB/s (target >= {ratios['distinct_target']:.0%}); "
              f"replicate / one: time to load the file onto every GPU over onto one "
              f"(target <= {ratios['replicate_target']}x).")
    return Group(table, "", ceilings, "", legend)


def _measure(out: Output, run: Callable[..., dict], config: Any) -> dict:
    """``run(config)`` under the progress bar; a bad setting is a usage error
    naming its option, a measurement gone wrong a failure said as it stands."""
    try:
        with _Bar(out) as bar:

            def refuse(completed: int, total: int, description: str) -> None:
                # The first step comes after the settings are checked, before
                # anything is written: where stdout is closed (>&-) the result
                # could only fail once the run is over, so the one line now,
                # without a document that cannot be written either.
                out.error(f"cannot write the result: {STDOUT_CLOSED}")
                raise typer.Exit(EXIT_FAILURE)

            closed = sys.stdout is None and (out.json or not out.quiet)
            return run(config, progress=refuse if closed else bar, warn=out.warn)
    except BenchConfigError as exc:
        option = _OPTION_NAMES.get(exc.option, "--" + exc.option.replace("_", "-"))
        raise UsageError(f"{option}: {exc}") from None
    except BenchError as exc:
        raise Failure(str(exc)) from None
    except OSError as exc:
        # A write or fsync that the filesystem refuses carries no file name,
        # and "No space left on device" alone does not say where: every file
        # the benchmark writes is in --dir.
        if exc.filename is None and exc.errno in _STORAGE_ERRORS:
            raise OSError(exc.errno, exc.strerror, os.path.abspath(config.dir)) from None
        raise


def _ignored(workload: str, given: dict[str, bool]) -> None:
    """A usage error for options that ``workload`` would not use: a command
    that runs should measure what it was asked to."""
    names = [name for name, on in given.items() if on]
    if names:
        raise UsageError(f"{', '.join(names)} cannot be used with {workload}: that workload does not use "
                         f"{'it' if len(names) == 1 else 'them'}")


def _files_benchmark(out: Output, files: Optional[int], file_size: Optional[str], mode: Optional[str],
                     threads: Optional[str], runs: int, directory: Path, host: bool, device: Optional[int], json: bool,
                     ranks: Optional[int] = None) -> None:
    if files is None:
        raise UsageError("--file-size needs --files")
    try:
        low, high = parse_size_range(_DEFAULT_FILE_SIZE if file_size is None else file_size, parse_size)
    except ValueError as exc:
        raise UsageError(f"--file-size: {exc}") from None
    modes = list(FILE_MODES) if mode is None else _list("--mode", mode, str.strip)
    where = options.choose_memory(out, host, device)
    # "auto" unless memory was named, as the one-file benchmark: the document
    # then says why it measured what it did, and copy runs as gdscp copy runs
    # by default (without a GPU).
    config = FilesConfig(
        files=files,
        low=low,
        high=high,
        modes=modes,
        runs=runs,
        dir=os.fspath(directory),
        memory="host" if host else ("gpu" if device is not None else "auto"),
        device=0 if where is None else where,
        threads=None if threads is None else _list("--threads", threads, parse_integer),
        ranks=ranks,
    )
    document = _measure(out, run_files_benchmark, config)
    out.result({"command": "benchmark", "ok": True, **document}, lambda: _files_render(document))
