"""``gdscp benchmark`` and the ``gdscp.bench`` library it runs on.

The command runs in-process on small files (a few MiB, three runs, 100 random
reads) so the whole module stays within seconds. Figures are never asserted
(this machine's speed is nobody's business); their presence, shape and
consistency are, and so are the bytes the tools moved.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from gdscp import memory
from gdscp.bench import ceilings, config, files, measure, report, runner, tools
from gdscp.bench.config import BenchConfig, BenchConfigError
from gdscp.bench.targets import HostTarget
from gdscp.cli import benchmark as benchmark_command
from gdscp.cli.app import run
from gdscp.info import mount_of

KiB = 1 << 10
MiB = 1 << 20
CEILINGS = {
    "pinned_h2d",
    "pinned_d2h",
    "host_memcpy",
    "page_cache_read",
    "disk_direct_read",
    "disk_buffered_read",
    "disk_direct_write",
    "disk_buffered_write",
}
BASELINES = {"python", "numpy_cupy", "kvikio", "preadv"}


def cli(capsys, *args: object) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(["benchmark", *[os.fspath(a) if isinstance(a, Path) else str(a) for a in args]])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".gdscp-bench-"))


def small(directory: Path, **changes) -> BenchConfig:
    """A quick host-memory configuration for library-level tests."""
    base = dict(
        size=2 * MiB, memory="host", threads=[1, 2], io_sizes=[4096], runs=3, random_ops=100, dir=str(directory)
    )
    base.update(changes)
    return BenchConfig(**base)


def check_spread(value: dict) -> None:
    assert set(value) == {"median", "min", "max"}
    assert 0 < value["min"] <= value["median"] <= value["max"]


# -- the command, end to end ---------------------------------------------------------


def test_json_holds_every_mode_baseline_and_ceiling(capsys, page_cache_folder):
    tmp_path = page_cache_folder  # cold reads need a disk behind the files
    code, out, err = cli(
        capsys, "--size", "4M", "--threads", "1,2", "--io-size", "4K,64K", "--ops", "100",
        "--runs", "3", "--drop-cache", "--dir", tmp_path, "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert leftovers(tmp_path) == []

    assert doc["command"] == "benchmark" and doc["ok"] is True
    assert doc["schema"] == runner.SCHEMA
    for key in (
        "date",
        "duration_s",
        "machine",
        "gdscp",
        "config",
        "cache_drop",
        "baselines",
        "ceilings",
        "results",
        "summary",
    ):
        assert key in doc
    machine = doc["machine"]
    assert machine["cpu"]["count"] >= 1 and machine["memory"]["total_bytes"] > 0
    assert "available" in machine["gpu"] and machine["filesystem"]["dir"] == str(tmp_path)
    assert doc["gdscp"]["version"] and doc["gdscp"]["settings"]["num_threads"] >= 1
    assert doc["config"]["size"] == 4 * MiB and doc["config"]["threads"] == [1, 2] and doc["config"]["runs"] == 3
    assert "posix_fadvise" in doc["cache_drop"]
    gpu = doc["config"]["memory"] == "gpu"

    # Every baseline is there: measured, or absent with the reason.
    assert set(doc["baselines"]) == BASELINES
    assert doc["baselines"]["python"]["available"] is True
    # On a GPU without CuPy (gdscp needs none), only that baseline is missing.
    assert doc["baselines"]["numpy_cupy"]["available"] is (gpu and memory.usable_cupy() is not None)
    # The bare system call is the random reads' floor in host memory.
    assert doc["baselines"]["preadv"]["available"] is (not gpu)
    for entry in doc["baselines"].values():
        assert entry["available"] or entry["reason"]
    try:
        import kvikio  # noqa: F401
    except ImportError:
        assert doc["baselines"]["kvikio"] == {"available": False, "reason": doc["baselines"]["kvikio"]["reason"]}
        assert "kvikio" in doc["baselines"]["kvikio"]["reason"]

    # Every ceiling is there: a figure, or why there is none.
    assert set(doc["ceilings"]) == CEILINGS
    for name, entry in doc["ceilings"].items():
        if entry["available"]:
            check_spread(entry["gb_per_s"])
            assert entry["what"] and len(entry["seconds"]) == 3
        else:
            assert entry["reason"], name
    assert doc["ceilings"]["disk_buffered_read"]["available"] and doc["ceilings"]["disk_buffered_write"]["available"]
    assert doc["ceilings"]["pinned_h2d" if gpu else "host_memcpy"]["available"]

    groups = {(r["mode"], r["cache"], r["io_size"], r["buffer"]) for r in doc["results"]}
    expected = {("read", "hot", None, "touched"), ("read", "cold", None, "touched"), ("write", None, None, "touched")}
    expected |= {("randread", cache, io, "touched") for cache in ("hot", "cold") for io in (4096, 65536)}
    if not gpu:  # host memory: also into a fresh numpy.empty array every run
        expected.add(("read", "hot", None, "fresh"))
    assert groups == expected
    measured = {name for name, entry in doc["baselines"].items() if entry["available"]}
    for group in expected:
        records = [r for r in doc["results"] if (r["mode"], r["cache"], r["io_size"], r["buffer"]) == group]
        assert sorted(r["threads"] for r in records if r["tool"] == "gdscp") == [1, 2]
        peers = measured if group[0] == "randread" else measured - {"preadv"}
        assert {r["tool"] for r in records} == {"gdscp"} | peers
        for r in records:
            assert r["runs"] == 3 and len(r["seconds"]) == 3 and r["what"]
            check_spread(r["gb_per_s"])
            if r["mode"] == "randread":
                assert r["ops"] == 100 and r["bytes"] == 100 * r["io_size"]
                check_spread(r["latency_us"]["p50"])
                assert r["latency_us"]["p50"]["median"] <= r["latency_us"]["p99"]["median"]
                check_spread(r["iops"])
            else:
                assert r["bytes"] == 4 * MiB
            if r["tool"] == "gdscp":
                assert set(r["factor"]) == BASELINES
                assert r["factor"]["python"] > 0
                if r["mode"] == "randread":
                    assert set(r["factor_p99"]) == BASELINES and r["factor_p99"]["python"] > 0
                    assert (r["factor"]["preadv"] is not None and r["factor"]["preadv"] > 0) is (not gpu)  # a host baseline only
    summary = {(row["mode"], row["cache"], row["io_size"], row["buffer"]): row for row in doc["summary"]}
    assert set(summary) == expected
    hot_ceilings = {"pinned_h2d"} if gpu else {"host_memcpy", "page_cache_read"}
    assert summary[("read", "hot", None, "touched")]["ceiling"]["name"] in hot_ceilings
    assert summary[("write", None, None, "touched")]["share_of_ceiling"] > 0


def test_json_objects_have_exactly_the_documented_keys(capsys, tmp_path):
    """Each object of the document holds the keys docs/benchmark-json.md lists
    for it, no more and no fewer, and the nulls it says."""
    code, out, err = cli(capsys, "--host", "--size", "1M", "--threads", "1,2", "--io-size", "64K,4K", "--ops", "100",
                         "--dir", tmp_path, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc) == ["command", "ok", "schema", "date", "duration_s", "machine", "gdscp", "config", "cache_drop",
                         "baselines", "ceilings", "results", "summary"]
    assert set(doc["machine"]) == {"cpu", "memory", "gpu", "os", "python", "filesystem", "numa", "nvidia_fs"}
    assert set(doc["gdscp"]) == {"version", "settings", "backend", "backend_reason"}
    assert set(doc["config"]) == {"size", "size_reason", "memory", "memory_reason", "device", "modes", "threads",
                                  "threads_reason", "task_size", "io_sizes", "runs", "random_ops", "drop_cache", "dir",
                                  "ceilings", "baselines", "seed"}
    assert doc["config"]["io_sizes"] == [4096, 65536]  # each once, smallest first
    for entry in doc["baselines"].values():
        assert set(entry) in ({"available", "what"}, {"available", "what", "version"}, {"available", "reason"})
    assert list(doc["ceilings"]) == ["pinned_h2d", "pinned_d2h", "host_memcpy", "page_cache_read", "disk_direct_read",
                                     "disk_buffered_read", "disk_direct_write", "disk_buffered_write"]
    for name, entry in doc["ceilings"].items():
        figures = {"available", "what", "bytes", "threads", "runs", "seconds", "gb_per_s"}
        if not entry["available"]:
            assert set(entry) - {"what", "applies"} == {"available", "reason"}, name
        elif name in ("host_memcpy", "page_cache_read", "disk_direct_read", "disk_direct_write"):
            assert set(entry) == figures | {"by_threads"}, name  # measured at each of the two thread counts
            assert [set(row) for row in entry["by_threads"]] == [{"threads", "gb_per_s", "seconds"}] * 2
        else:
            assert set(entry) == figures, name
    record = {"tool", "mode", "cache", "buffer", "memory", "threads", "task_size", "io_size", "bytes", "runs",
              "seconds", "what", "gb_per_s", "ceiling", "share_of_ceiling"}
    for r in doc["results"]:
        keys = set(record)
        if r["tool"] == "gdscp":
            keys.add("factor")
        if r["mode"] == "randread":
            keys |= {"ops", "latency_us", "iops"} | ({"factor_p99"} if r["tool"] == "gdscp" else set())
            assert set(r["latency_us"]) == {"p50", "p99", "mean"}
        assert set(r) == keys, r
        library = r["tool"] in ("gdscp", "kvikio")
        assert (r["threads"] is None, r["task_size"] is None) == (not library, not library), r
        assert (r["io_size"] is None) is (r["mode"] != "randread") and (r["cache"] is None) is (r["mode"] == "write")
    for row in doc["summary"]:
        keys = {"mode", "cache", "io_size", "buffer", "best", "ceiling", "share_of_ceiling", "factor"}
        assert set(row) == keys | ({"factor_p99"} if row["mode"] == "randread" else set()), row
        for best in row["best"].values():
            assert set(best) == {"threads", "gb_per_s"} | ({"p50_us", "p99_us"} if row["mode"] == "randread" else set())
        assert row["ceiling"] is None or set(row["ceiling"]) == {"name", "gb_per_s"}


def test_table_names_gdscp_and_each_baseline(capsys, tmp_path):
    code, out, err = cli(
        capsys,
        "--size",
        "1M",
        "--threads",
        "1",
        "--mode",
        "read,randread",
        "--io-size",
        "4K",
        "--ops",
        "100",
        "--dir",
        tmp_path,
    )
    assert code == 0, err
    for text in (
        "sequential",
        "random reads",
        "gdscp",
        "python",
        "x python",
        "host_memcpy" if "host memory" in out else "pinned_h2d",
    ):
        assert text in out
    assert "kvikio" in out  # compared, or said why not
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--size", "abc"], "--size"),
        (["--size", "100"], "--size"),
        (["--size", "1P"], "--size"),
        (["--threads", "0"], "--threads"),
        (["--threads", "two"], "--threads"),
        (["--threads", "1,,4"], "--threads"),
        (["--task-size", "1K"], "--task-size"),
        (["--task-size", "huge"], "--task-size"),
        (["--mode", "read,fly"], "--mode"),
        (["--mode", ""], "--mode"),
        (["--io-size", "0"], "--io-size"),
        (["--io-size", "4K,lots"], "--io-size"),
        (["--size", "1M", "--io-size", "2M"], "--io-size"),
        (["--runs", "2"], "--runs"),
        (["--runs", "many"], "--runs"),
        (["--ops", "10"], "--ops"),
        (["--device", "-1"], "--device"),
        (["--host", "--device", "0"], "--device"),
        (["--plot", "figure.txt"], "--plot"),
        (["--plot", "no/such/dir/figure.png"], "--plot"),
        (["--compat-mode", "sometimes"], "--compat-mode"),
    ],
)
def test_bad_values_exit_2_with_one_line(capsys, tmp_path, monkeypatch, args, culprit):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, *args, "--dir", tmp_path)
    assert code == 2, err
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and culprit in lines[0], err
    assert "Traceback" not in err
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("option, value", [("--runs", "\u0663"), ("--threads", "\u0664"), ("--ops", "\u0661\u0660\u0660"),
                                           ("--files", "\u0665"), ("--runs", "1_0")])
def test_counts_are_ascii_digits(capsys, tmp_path, option, value):
    """Counts are written in ASCII digits, as GDSCP_NUM_THREADS and the
    other commands' counts are (Python's int() takes "\u0663" for 3, and "1_0"):
    refused as the options are read, before the folder is looked at."""
    code, out, err = cli(capsys, option, value, "--host", "--dir", tmp_path / "missing")
    assert (code, out) == (2, ""), err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert option in line and f"{value!r} is not a whole number" in line, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["missing", "file"])
def test_bad_dir_exits_2(capsys, tmp_path, where):
    target = tmp_path / "nowhere"
    if where == "file":
        target.write_bytes(b"x")
    code, _, err = cli(capsys, "--dir", target)
    assert code == 2 and "--dir" in err


@pytest.mark.parametrize("workload", [["--size", "1M"], ["--files", "3"]])
def test_an_empty_dir_is_refused_not_taken_for_the_current_directory(capsys, tmp_path, monkeypatch, workload):
    """--dir "$SCRATCH" with SCRATCH unset: a usage error, as an empty path is
    for the other commands, not test files in whatever directory the script
    happens to be in."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "--host", *workload, "--dir", "", "--json")
    assert code == 2, err
    assert json.loads(out)["ok"] is False
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "--dir" in line and "empty" in line, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("workload, runner", [(["--size", "1M"], "run_benchmark"),
                                              (["--files", "3"], "run_files_benchmark")])
def test_a_closed_stdout_is_said_before_anything_is_measured(capsys, tmp_path, monkeypatch, workload, runner):
    """With stdout closed (>&-) the result has nowhere to go: said at once,
    exit 1, not after minutes of measuring and gigabytes written. With -q
    and no --json there is no result to write, and the benchmark runs."""
    from gdscp.cli import benchmark as command

    measured = []

    def measure(config, progress, warn):
        progress(0, 1, "writing the test files")  # after the settings are checked, before any file
        measured.append(config)
        return {}

    monkeypatch.setattr(sys, "stdout", None)
    # A bad setting is still the usage error it is.
    assert run(["benchmark", "--host", *workload, "--dir", str(tmp_path / "none"), "--json"]) == 2
    assert "--dir" in capsys.readouterr().err
    monkeypatch.setattr(command, runner, measure)
    for extra in ([], ["--json"], ["--json", "-q"]):
        capsys.readouterr()
        code = run(["benchmark", "--host", *workload, "--dir", str(tmp_path), *extra])
        assert code == 1 and measured == [], extra
        assert capsys.readouterr().err.splitlines() == [
            "gdscp benchmark: error: cannot write the result: standard output is closed"], extra
    assert run(["benchmark", "--host", *workload, "--dir", str(tmp_path), "-q"]) == 0
    assert len(measured) == 1
    assert list(tmp_path.iterdir()) == []


def test_device_that_does_not_exist_exits_2(capsys, tmp_path):
    code, _, err = cli(capsys, "--device", "64", "--dir", tmp_path)
    assert code == 2 and "GPU 64" in err


def test_plot_without_matplotlib_says_how_to_get_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, _, err = cli(capsys, "--plot", tmp_path / "b.png", "--dir", tmp_path)
    assert code == 2
    assert "matplotlib" in err and "gdscp[plot]" in err
    assert leftovers(tmp_path) == [] and not (tmp_path / "b.png").exists()


def test_a_plot_that_names_a_directory_is_refused_before_measuring(capsys, tmp_path):
    """--plot naming a directory cannot be written: a usage error at once,
    not a whole run whose document says ok and whose exit code says not."""
    (tmp_path / "figure.png").mkdir()
    code, out, err = cli(capsys, "--host", "--size", "1M", "--threads", "1", "--mode", "read", "--plot",
                         tmp_path / "figure.png", "--dir", tmp_path, "--json")
    assert code == 2, err
    assert json.loads(out)["ok"] is False
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "--plot" in line and "is a directory" in line, err
    assert leftovers(tmp_path) == [] and list((tmp_path / "figure.png").iterdir()) == []


def test_plot_is_written(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    picture = tmp_path / "bench.png"
    code, _, err = cli(
        capsys,
        "--size",
        "1M",
        "--threads",
        "1,2",
        "--io-size",
        "4K",
        "--ops",
        "100",
        "--plot",
        picture,
        "--dir",
        tmp_path,
    )
    assert code == 0, err
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert leftovers(tmp_path) == []


@pytest.fixture
def plot_stand_in(monkeypatch):
    """matplotlib as far as the command looks for it, and a plot that writes
    its file as matplotlib would (opened for writing where --plot leads): the
    pictures themselves are test_plot_is_written's."""
    from gdscp.cli import benchmark as command

    monkeypatch.setitem(sys.modules, "matplotlib", types.SimpleNamespace(use=lambda backend: None))
    drawn = []

    def draw(document, path):
        with open(path, "wb") as f:
            f.write(b"picture of " + document["schema"].encode())
        drawn.append(path)

    monkeypatch.setattr(command, "plot", draw)
    return drawn


@pytest.mark.parametrize("name, said", [
    (".png", "'.png' has no name before its suffix"),
    ("sub/.SVG", "'sub/.SVG' has no name before its suffix"),
    ("", "must not be empty"),
    ("afile/x.png", "'afile' is not a directory"),
    ("afile/deeper/x.png", "'afile' is not a directory"),
])
def test_a_plot_name_that_cannot_be_written_is_refused_saying_why(capsys, tmp_path, monkeypatch, plot_stand_in,
                                                                   name, said):
    """A name that is only a suffix (Path('.png').suffix is empty), an empty
    name (Path('') is '.') and a directory that is a file are each said as
    what they are."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    code, out, err = cli(capsys, "--host", "--size", "4K", "--threads", "1", "--mode", "read", "--plot", name,
                         "--dir", tmp_path, "--json")
    assert code == 2, err
    assert json.loads(out)["ok"] is False
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "--plot" in line and said in line, err
    assert leftovers(tmp_path) == [] and plot_stand_in == []


def test_a_plot_on_a_read_only_filesystem_is_refused_before_measuring(capsys, tmp_path, monkeypatch, plot_stand_in):
    """A --plot file in a directory this process may not write (here a
    read-only filesystem, as access(2) and statvfs report it), or a symbolic
    link leading there, is a usage error before the run, not a failure once
    its figures are out."""
    from gdscp.cli import benchmark as command

    ro = tmp_path / "ro"
    ro.mkdir()
    (tmp_path / "link.png").symlink_to(ro / "figure.png")
    real_access, real_statvfs = os.access, os.statvfs

    def access(path, mode, **kw):
        if os.fspath(path) == str(ro) and mode & os.W_OK:
            return False
        return real_access(path, mode, **kw)

    def statvfs(path):
        got = real_statvfs(path)
        if os.fspath(path) != str(ro):
            return got
        return os.statvfs_result((got.f_bsize, got.f_frsize, got.f_blocks, got.f_bfree, got.f_bavail, got.f_files,
                                  got.f_ffree, got.f_favail, got.f_flag | os.ST_RDONLY, got.f_namemax))

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "statvfs", statvfs)
    measured = []
    monkeypatch.setattr(command, "run_benchmark", lambda *a, **kw: measured.append(a) or {})
    for name in (ro / "figure.png", tmp_path / "link.png"):
        code, out, err = cli(capsys, "--host", "--size", "4K", "--threads", "1", "--mode", "read", "--plot", name,
                             "--dir", tmp_path, "--json")
        assert code == 2, err
        assert json.loads(out)["ok"] is False
        (line,) = [line for line in err.splitlines() if "error" in line]
        assert f"--plot: cannot write '{name}': Read-only file system" in line, err
    assert measured == [] and plot_stand_in == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.png", "ro"] and list(ro.iterdir()) == []


def test_a_plot_that_fails_once_the_run_is_over_makes_the_document_say_so(capsys, tmp_path, monkeypatch,
                                                                            plot_stand_in):
    """Where the picture cannot be saved after all (the disk filled up
    meanwhile), the document holds the figures and says ok: false, with the
    error and the exit code the command ends with; the table is printed, and
    the error said after it."""
    from gdscp.cli import benchmark as command

    args = ["--host", "--size", "4K", "--threads", "1", "--mode", "read", "--dir", tmp_path]
    picture = tmp_path / "bench.png"
    code, out, err = cli(capsys, *args, "--plot", picture, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] is True and "error" not in doc
    assert plot_stand_in == [str(picture)] and picture.read_bytes() == b"picture of gdscp-benchmark/1"

    def full(document, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(command, "plot", full)
    code, out, err = cli(capsys, *args, "--plot", picture, "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["ok"] is False and doc["exit_code"] == 1
    assert doc["error"] == f"cannot write the plot: '{picture}': No space left on device"
    assert doc["schema"] == "gdscp-benchmark/1" and [r["tool"] for r in doc["results"]][0] == "gdscp"
    assert [line for line in err.splitlines() if "error" in line] == [f"gdscp benchmark: error: {doc['error']}"]
    code, out, err = cli(capsys, *args, "--plot", picture)
    assert code == 1 and out.startswith("gdscp benchmark: a 4 KiB file in "), err
    assert "cannot write the plot" in err and "plot written" not in err
    assert leftovers(tmp_path) == []


def test_interrupt_removes_the_files_and_exits_130(tmp_path):
    """Ctrl-C from outside, as a person would press it, while the file is being
    made or measured."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gdscp", "benchmark", "--size", "256M", "--dir", str(tmp_path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not glob.glob(str(tmp_path / ".gdscp-bench-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert json.loads(out)["ok"] is False
    assert leftovers(tmp_path) == []


def test_many_files_workload_compares_copy_and_read(capsys, tmp_path):
    code, out, err = cli(capsys, "--files", "30", "--file-size", "1K-8K", "--host", "--dir", tmp_path, "--json",
                         "--threads", "1,2")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "gdscp-benchmark-files/1" and doc["config"]["files"] == 30
    assert 30 * 1024 <= doc["config"]["bytes"] <= 30 * 8192
    copy, read = doc["workloads"]
    assert [r["tool"] for r in copy["results"]] == ["gdscp", "cp"]
    gdscp, cp = copy["results"]
    assert len(gdscp["seconds"]) == len(cp["seconds"]) == 3
    assert gdscp["factor"]["cp"] == round(cp["median_s"] / gdscp["median_s"], 4)
    check_spread(gdscp["command_seconds"])
    assert [r["tool"] for r in read["results"]][:3] == ["gdscp", "gdscp-one-file", "python"]
    assert all(len(r["seconds"]) == 3 for r in read["results"])  # the warm-up round is not timed
    assert read["results"][0]["factor"]["python"] > 0
    one = read["results"][1]
    assert read["results"][0]["share_of_one_file"] == round(one["median_s"] / read["results"][0]["median_s"], 4)
    if not read["kvikio"]["available"]:
        assert read["results"][0]["factor"]["kvikio"] is None and "kvikio" in read["kvikio"]["reason"]
    assert set(doc["ceilings"]) == {"disk_direct_write", "disk_buffered_write"}
    assert list(tmp_path.iterdir()) == []
    code, out, err = cli(capsys, "--files", "10", "--file-size", "2K", "--host", "--dir", tmp_path, "--mode", "read")
    assert code == 0 and "read:" in out and "copy:" not in out


@pytest.mark.parametrize("args, culprit", [
    (["--files", "0"], "--files"),
    (["--files", "5", "--file-size", "8K-1K"], "--file-size"),
    (["--file-size", "1K"], "--files"),
    (["--files", "5", "--mode", "randread"], "--mode"),
])
def test_many_files_bad_values(capsys, tmp_path, args, culprit):
    code, out, err = cli(capsys, *args, "--host", "--dir", tmp_path)
    assert code == 2 and culprit in err and out == ""


@pytest.mark.parametrize("changes, option, said", [
    ({"runs": 1001}, "runs", "at most 1000"),
    ({"threads": [1, 1025]}, "threads", "at most 1024"),
    ({"threads": [0]}, "threads", "at least 1"),
])
def test_many_files_workload_bounds_runs_and_threads_as_the_one_file_benchmark(tmp_path, changes, option, said):
    """--runs and --threads have the same bounds in every workload: the
    one-file benchmark's (a runaway count is refused, not run for days)."""
    from gdscp.bench import many

    config = many.FilesConfig(files=5, low=1024, high=1024, dir=str(tmp_path), memory="host", **changes)
    with pytest.raises(BenchConfigError) as info:
        many.run_files_benchmark(config)
    assert info.value.option == option and said in str(info.value), info.value
    assert list(tmp_path.iterdir()) == []


def test_ranks_past_a_few_per_core_are_refused_before_any_launcher_is_looked_for(capsys, tmp_path, monkeypatch):
    """--ranks starts every rank on this machine: a count past 4 per usable
    core is a usage error naming the option and the most it takes, before
    mpiexec is looked for (or could start anything); the most is taken."""
    from gdscp.bench import many

    def launcher() -> str:
        raise BenchConfigError("ranks", "looked for a launcher")

    monkeypatch.setattr(many, "_mpiexec", launcher)
    cores = len(os.sched_getaffinity(0))
    most = 4 * cores
    for ranks in (most + 1, 10**5):
        code, out, err = cli(capsys, "--files", "5", "--file-size", "1K", "--host", "--mode", "copy", "--dir",
                             tmp_path, "--ranks", ranks, "--json")
        assert code == 2, err
        assert err.splitlines() == [f"gdscp benchmark: error: --ranks: {ranks}: at most {most} ranks start on this "
                                    f"machine (4 per usable core, {cores} core{'s' if cores != 1 else ''})"], err
        assert json.loads(out)["exit_code"] == 2
    with pytest.raises(BenchConfigError, match="looked for a launcher"):
        many.run_files_benchmark(many.FilesConfig(files=5, low=1024, high=1024, modes=["copy"], dir=str(tmp_path),
                                                  memory="host", ranks=most))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size, said", [("1", "1 byte is too small: the task size must be at least 4 KiB"),
                                         ("2T", "2 TiB is too large: the task size must be at most 1 TiB")])
@pytest.mark.parametrize("workload", [["--files", "5", "--file-size", "1K", "--host"], ["--devices", "0,1", "--size", "1M"]])
def test_task_size_has_the_one_file_benchmarks_bounds_in_every_workload(capsys, tmp_path, size, said, workload):
    """--task-size is refused outside 4 KiB..1 TiB whichever workload it is
    given to, before anything is measured or written (or a GPU looked for)."""
    code, out, err = cli(capsys, *workload, "--dir", tmp_path, "--task-size", size, "--json")
    assert code == 2, err
    assert err.splitlines() == [f"gdscp benchmark: error: --task-size: {said}"], err
    assert json.loads(out)["exit_code"] == 2
    code, out, err = cli(capsys, "--size", "1M", "--host", "--dir", tmp_path, "--task-size", size)
    assert (code, err.splitlines()) == (2, [f"gdscp benchmark: error: --task-size: {said}"])
    assert list(tmp_path.iterdir()) == []


def test_many_files_workload_measures_each_mode_once(capsys, tmp_path):
    code, out, err = cli(capsys, "--files", "5", "--file-size", "1K", "--host", "--mode", "read,read", "--dir",
                         tmp_path, "--runs", "3", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["config"]["modes"] == ["read"] and [w["mode"] for w in doc["workloads"]] == ["read"]
    assert list(tmp_path.iterdir()) == []


def test_many_files_workload_measures_each_thread_count_once(capsys, tmp_path):
    code, out, err = cli(capsys, "--files", "5", "--file-size", "1K", "--host", "--mode", "read", "--dir", tmp_path,
                         "--threads", "4,1,4", "--json")
    assert code == 0, err
    assert json.loads(out)["config"]["threads"] == [1, 4]
    code, out, err = cli(capsys, "--files", "5", "--file-size", "1K", "--host", "--mode", "read", "--dir", tmp_path,
                         "--threads", "5000")
    assert code == 2 and out == "" and "--threads: 5000 is too large" in err, err
    assert list(tmp_path.iterdir()) == []


def test_tree_sizes_and_contents(tmp_path):
    from gdscp.bench.tree import make_tree, parse_size_range
    from gdscp.cli.units import parse_size

    assert parse_size_range("1K-64K", parse_size) == (1024, 65536)
    assert parse_size_range("4K", parse_size) == (4096, 4096)
    tree = make_tree(str(tmp_path), 250, 0, 5000, seed=1)
    assert len(tree.paths) == 250 and len({os.path.dirname(p) for p in tree.paths}) == 3
    assert [os.path.getsize(p) for p in tree.paths] == tree.sizes and 0 <= min(tree.sizes)
    contents = [Path(p).read_bytes() for p in tree.paths if os.path.getsize(p) >= 8]
    assert len(set(contents)) == len(contents), "two files hold the same bytes"


# -- the library ---------------------------------------------------------------------


def test_interrupt_inside_a_measurement_removes_the_files(tmp_path):
    def progress(done, total, description):
        if description.startswith("read hot: gdscp"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run_benchmark(small(tmp_path), progress=progress)
    assert leftovers(tmp_path) == []


def test_progress_counts_every_step_once(tmp_path):
    seen = []
    runner.run_benchmark(
        small(tmp_path, modes=["read", "write"], ceilings=False), progress=lambda d, t, s: seen.append((d, t, s))
    )
    totals = {t for _, t, _ in seen}
    assert len(totals) == 1
    total = totals.pop()
    assert [d for d, _, _ in seen] == list(range(total + 1))
    assert seen[-1] == (total, total, "done")


def test_a_broken_baseline_leaves_with_its_reason(tmp_path, monkeypatch):
    def broken(self, handle, buf, size, offset, task_size):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(tools.PythonTool, "read", broken)
    warnings = []
    doc = runner.run_benchmark(small(tmp_path, modes=["read", "randread"]), warn=warnings.append)
    assert doc["baselines"]["python"]["available"] is False
    assert "Input/output error" in doc["baselines"]["python"]["reason"]
    tools_measured = {r["tool"] for r in doc["results"]}
    assert "python" not in tools_measured and "gdscp" in tools_measured  # KvikIO too, where importable
    assert all(r["factor"]["python"] is None for r in doc["results"] if r["tool"] == "gdscp")
    assert any("python" in w for w in warnings)
    assert leftovers(tmp_path) == []


def test_a_gdscp_failure_is_not_hidden(tmp_path, monkeypatch):
    def broken(self, handle, buf, size, offset, task_size):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(tools.GdscpTool, "read", broken)
    with pytest.raises(OSError):
        runner.run_benchmark(small(tmp_path, modes=["read"]))
    assert leftovers(tmp_path) == []


def test_wrong_bytes_are_caught(tmp_path):
    path = tmp_path / "data"
    files.make_file(str(path), MiB, seed=3)

    class Liar(tools.Tool):
        name = "liar"

        def open(self, path, mode):
            return None

        def close(self, handle):
            pass

        def read(self, handle, buf, size, offset, task_size):
            return size  # claims the bytes, delivers none

        def write(self, handle, buf, size, task_size):
            return size

        def describe(self, mode):
            return "a tool that lies"

    buf = HostTarget().empty(MiB)
    liar = Liar(HostTarget())
    measure.time_seq_read(liar, str(path), buf, MiB)
    with pytest.raises(measure.BenchError, match="wrong bytes"):
        measure.check_read(liar, str(path), buf, MiB)


@pytest.mark.parametrize("cupy, upload, download", [
    (None, "cuMemcpyHtoD into the device buffer", "cuMemcpyDtoH into host"),
    (object(), "cupy .set(host) into the device buffer", "cupy .get(out=host)"),
])
def test_the_python_baseline_names_the_copy_it_makes_to_the_gpu(cupy, upload, download):
    # Without CuPy the device buffer is gdscp's own, copied with the driver's calls (GpuTarget.upload).
    python = tools.PythonTool(types.SimpleNamespace(kind="gpu", cupy=cupy), np.empty(1, dtype=np.uint8))
    assert python.describe("read") == (
        f"open(path, 'rb', buffering=0).readinto(host) into a preallocated buffer then {upload}")
    assert python.describe("randread") == f"f.seek(offset); f.readinto(view) then {upload}, one call at a time"
    assert python.describe("write") == f"{download} then open(path, 'wb', buffering=0).write(host) then os.fsync"


@pytest.mark.parametrize("make", [lambda t, b: tools.GdscpTool(t, 2), lambda t, b: tools.PythonTool(t, b)])
def test_tools_move_the_right_bytes(tmp_path, make):
    source, copy = tmp_path / "source", tmp_path / "copy"
    size = 3 * MiB + 5
    files.make_file(str(source), size, seed=7)
    expected = source.read_bytes()
    target = HostTarget()
    buf = target.empty(size)
    tool = make(target, buf)
    with tool.configured():
        assert measure.time_seq_read(tool, str(source), buf, size, cold=True) > 0
        assert bytes(buf) == expected
        assert measure.time_seq_write(tool, str(copy), buf, size) > 0
        assert copy.read_bytes() == expected
        offsets = measure.random_offsets(size, 4096, 50, seed=1)
        latencies = measure.time_random_reads(tool, str(source), buf, 4096, offsets, cold=True)
    assert len(latencies) == 50 and all(t > 0 for t in latencies)
    last = int(offsets[-1])
    assert bytes(buf[:4096]) == expected[last : last + 4096]


def test_make_file_blocks_all_differ(tmp_path):
    path = tmp_path / "data"
    size = 2 * files._BLOCK + 100
    files.make_file(str(path), size, seed=1)
    data = path.read_bytes()
    assert len(data) == size
    first, second = data[: files._BLOCK], data[files._BLOCK : 2 * files._BLOCK]
    assert first != second and first[8:] == second[8:]  # one random block, numbered
    assert data[2 * files._BLOCK + 8 :] == first[8:100]


def test_random_offsets_are_aligned_and_inside_the_file():
    offsets = measure.random_offsets(10 * MiB + 100, 65536, 1000, seed=0)
    assert len(offsets) == 1000
    assert all(o % 65536 == 0 and 0 <= o and o + 65536 <= 10 * MiB + 100 for o in offsets)
    assert len(set(offsets.tolist())) > 100
    assert (offsets == measure.random_offsets(10 * MiB + 100, 65536, 1000, seed=0)).all()


def test_drop_cache_says_how(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(b"x" * 8192)
    assert files.drop_cache(str(path), use_drop_caches=False) == "posix_fadvise(POSIX_FADV_DONTNEED)"


def test_direct_io_refused_is_reported_not_raised(page_cache_folder, monkeypatch):
    """tmpfs before Linux 6.6, many FUSE and network filesystems: open(O_DIRECT) fails with EINVAL."""
    import errno

    tmp_path = page_cache_folder  # the disk's cold read ceilings need a disk

    def refuse(path, flags):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)

    monkeypatch.setattr(ceilings, "_open_direct", refuse)
    path = str(tmp_path / "data")
    files.make_file(path, MiB)
    for entry in (
        ceilings.direct_read_rate(path, MiB, 2, 3),
        ceilings.direct_write_rate(str(tmp_path / "out"), MiB, 2, 3),
    ):
        assert entry["available"] is False
        assert "O_DIRECT" in entry["reason"] and "Invalid argument" in entry["reason"]
    doc = runner.run_benchmark(small(tmp_path, modes=["read", "write"], threads=[1]))
    assert doc["ceilings"]["disk_direct_read"]["available"] is False
    assert doc["ceilings"]["disk_buffered_read"]["available"] is True
    write = next(row for row in doc["summary"] if row["mode"] == "write")
    assert write["ceiling"]["name"] == "disk_buffered_write"


def test_direct_ceilings_move_the_whole_file(tmp_path):
    path = str(tmp_path / "data")
    files.make_file(path, 3 * MiB + 4096, seed=2)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    read = ceilings.direct_read_rate(path, 3 * MiB + 4096, 3, 3)
    assert read["available"] and read["bytes"] == 3 * MiB + 4096 and read["threads"] == 3
    write = ceilings.direct_write_rate(str(tmp_path / "out"), 3 * MiB + 100, 2, 3)
    assert write["available"] and write["bytes"] == 3 * MiB
    assert os.path.getsize(tmp_path / "out") == 3 * MiB


def test_direct_write_ceiling_writes_the_tools_bytes(tmp_path):
    """The write ceiling writes the benchmark's own buffer (aligned: as is;
    unaligned: a copy), so it moves what the tools move from the same memory."""
    try:
        os.close(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    size = 3 * MiB + 4096
    data = np.random.default_rng(5).integers(0, 256, size + 1, dtype=np.uint8)
    for source in (memory.allocate(size), data[1:]):  # page-aligned, then misaligned by one byte
        source[:] = data[1:]
        out = tmp_path / "out"
        write = ceilings.direct_write_rate(str(out), size, 2, 3, source)
        assert write["available"] and write["runs"] == 3
        assert out.read_bytes() == data[1:].tobytes()


def test_page_cache_ceiling_reads_the_whole_file(tmp_path):
    size = 2 * MiB + 4095
    path = tmp_path / "data"
    files.make_file(str(path), size, seed=4)
    files.warm_cache(str(path))
    for threads in (1, 3):
        dst = np.zeros(size, dtype=np.uint8)
        entry = ceilings.page_cache_read_rate(str(path), size, dst, threads, 2)
        assert entry["available"] and entry["threads"] == threads and entry["runs"] == 2
        assert dst.tobytes() == path.read_bytes()
    assert not ceilings.page_cache_read_rate(str(path), 0, np.zeros(1, np.uint8), 2, 2)["available"]


def test_a_ceiling_with_one_slice_copies_on_the_calling_thread(tmp_path, monkeypatch):
    """A size too small to give each thread 1 MiB (and any size on one
    thread) is copied by the calling thread, as gdscp reads a small request:
    no pool, whose handoff costs more than copying a few KiB and made gdscp
    look several times faster than the machine's ceiling."""

    class NoPool:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a thread pool for one slice")

    monkeypatch.setattr(ceilings, "ThreadPoolExecutor", NoPool)
    for size, threads in ((4096, 1), (64 * KiB, 4), (MiB + 4095, 2), (3 * MiB, 1)):
        path = tmp_path / f"data-{size}"
        files.make_file(str(path), size, seed=3)
        files.warm_cache(str(path))
        dst = np.zeros(size, dtype=np.uint8)
        for entry in (ceilings.host_memcpy_rate(size, threads, 2),
                      ceilings.page_cache_read_rate(str(path), size, dst, threads, 2)):
            assert entry["available"] and entry["threads"] == threads and entry["runs"] == 2, entry
            assert entry["bytes"] == size and all(s > 0 for s in entry["seconds"])
            alone = "(the calling thread alone: slices of at least 1 MiB)"
            assert (alone in entry["what"]) == (threads > 1), entry["what"]
        assert dst.tobytes() == path.read_bytes()


@pytest.mark.parametrize("which", ["host_memcpy", "page_cache_read"])
def test_a_ceiling_split_among_threads_is_timed_inside_them(tmp_path, monkeypatch, which):
    """Slices of at least 1 MiB, one per thread (3 MiB among 4 threads: 3
    of them), each copied by a worker; a run is timed inside the workers,
    from the first copy's start to the last one's end, so that neither the
    handoff to the pool nor the wait for its results is charged to the
    ceiling."""
    size, threads, runs = 3 * MiB + 4096, 4, 2
    path = tmp_path / "data"
    files.make_file(str(path), size, seed=5)
    files.warm_cache(str(path))
    readings: list[tuple[int, float]] = []

    def perf_counter() -> float:
        now = time.perf_counter()
        readings.append((threading.get_ident(), now))
        return now

    monkeypatch.setattr(ceilings, "time", types.SimpleNamespace(perf_counter=perf_counter))
    dst = np.zeros(size, dtype=np.uint8)
    if which == "host_memcpy":
        entry = ceilings.host_memcpy_rate(size, threads, runs)
    else:
        entry = ceilings.page_cache_read_rate(str(path), size, dst, threads, runs)
        assert dst.tobytes() == path.read_bytes()
    assert entry["available"] and entry["threads"] == threads and entry["runs"] == runs
    assert "4 threads (3 of them: slices of at least 1 MiB)" in entry["what"]
    assert readings and threading.get_ident() not in {who for who, _ in readings}
    # Two methods measured (the better one reported), each run a start and
    # an end on every slice; a run's time is the span of its readings.
    per_run = 2 * 3
    assert len(readings) == 2 * (runs + 1) * per_run
    spans = [[round(max(t for _, t in run) - min(t for _, t in run), 9)
              for run in (half[i:i + per_run] for i in range(per_run, len(half), per_run))]
             for half in (readings[: len(readings) // 2], readings[len(readings) // 2:])]
    assert entry["seconds"] in spans


def test_host_side_ceiling_reads_every_byte_on_plain_threads(tmp_path):
    """The multi-GPU host-side ceiling (page_cache_rate) reads through
    _core.timed_preads: every piece, each into its thread's own buffer, with
    the bytes the file holds there; a short file, a bad descriptor or a piece
    naming no file are reported, not hidden."""
    from gdscp import _core

    size = 5 * MiB + 4097
    path = tmp_path / "data"
    files.make_file(str(path), size, seed=6)
    data = path.read_bytes()
    entry = ceilings.page_cache_rate([str(path), str(path)], 3, 2, request=MiB)
    assert entry["available"] and entry["bytes"] == 2 * size and entry["runs"] == 2 and entry["threads"] == 3
    fd = os.open(path, os.O_RDONLY)
    try:
        bufs = [np.zeros(MiB, dtype=np.uint8) for _ in range(2)]
        addresses = [b.ctypes.data for b in bufs]
        edges = [0, 1, 4095, 4097, size - 1]  # one piece each: a thread's buffer holds its last piece
        for off in edges:
            n = min(MiB, size - off)
            seconds, moved, error = _core.timed_preads([fd], [(0, off, n)], addresses[:1])
            assert (moved, error) == (n, 0) and seconds >= 0
            assert bufs[0][:n].tobytes() == data[off:off + n]
        pieces = [(0, off, min(MiB, size - off)) for off in range(0, size, MiB)]
        assert _core.timed_preads([fd], pieces, addresses)[1:] == (size, 0)
        # Past the end: the bytes come up short, and the caller sees it.
        assert _core.timed_preads([fd], [(0, size - 10, 4096)], addresses)[1:] == (10, 0)
        assert _core.timed_preads([-1], [(0, 0, 10)], addresses)[1:] == (0, errno.EBADF)
        with pytest.raises(IndexError, match="not in fds"):
            _core.timed_preads([fd], [(1, 0, 10)], addresses)
        assert _core.timed_preads([fd], [], addresses)[1:] == (0, 0)
    finally:
        os.close(fd)


def test_ceilings_run_between_the_rounds_they_bound(tmp_path):
    """A measurement's ceiling runs once in each round of the tools, so a
    drifting disk weighs on both; other ceilings run once, before. Each round
    starts one place further along the tools and ceilings, so that none
    always runs first."""
    seen = []
    doc = runner.run_benchmark(
        small(tmp_path, modes=["read", "write"], threads=[2], baselines=False),
        progress=lambda d, t, s: seen.append(s),
    )
    order = [s for s in seen if "run " in s]
    rounds = [[s for s in order if s.startswith("read hot:") and f"run {r}/3" in s] for r in (1, 2, 3)]
    def who(step):
        return step.split(": ", 1)[1].split(", run")[0]

    hot = [who(s) for s in rounds[0]]
    assert hot == ["gdscp (2 threads)", "ceiling: host memory copy, 2 threads",
                   "ceiling: page cache into host memory, 2 threads"]
    assert [[who(s) for s in steps] for steps in rounds] == [hot, hot[1:] + hot[:1], hot[2:] + hot[:2]]
    writes = [who(s) for s in order if s.startswith("write:")]
    assert writes[:3] == ["gdscp (2 threads)", "ceiling: disk O_DIRECT write, 2 threads", "ceiling: disk buffered write"]
    assert writes[3:6] == writes[1:3] + writes[:1]
    assert any(s.startswith("ceiling: disk O_DIRECT read") for s in seen)  # no cold group: measured before
    for name in ("host_memcpy", "page_cache_read", "disk_direct_write", "disk_buffered_write"):
        entry = doc["ceilings"][name]
        if entry.get("available"):
            assert entry["runs"] == 3 and len(entry["seconds"]) == 3
    hot = next(r for r in doc["summary"] if r["mode"] == "read" and r["cache"] == "hot")
    assert hot["ceiling"]["name"] in ("host_memcpy", "page_cache_read")


def test_default_threads_follow_the_cores():
    import gdscp

    default = gdscp.defaults.get("num_threads")
    assert config.default_threads(2)[0] == sorted({1, 4, default})
    assert config.default_threads(16)[0] == sorted({1, 4, default, 16})
    assert max(config.default_threads(128)[0]) == max(16, default)


def test_default_size_shrinks_where_room_is_short(tmp_path, monkeypatch):
    assert config.default_size(str(tmp_path), "host", None)[0] <= config.DEFAULT_SIZE
    monkeypatch.setattr(config, "free_disk", lambda d: 200 * MiB + 12345)
    size, reason = config.default_size(str(tmp_path), "host", None)
    assert size == 50 * MiB and "disk" in reason
    monkeypatch.setattr(config, "available_memory", lambda: 100 * MiB)
    size, reason = config.default_size(str(tmp_path), "host", None)
    assert size == 25 * MiB and "memory" in reason
    monkeypatch.setattr(config, "free_disk", lambda d: 8 * MiB)
    with pytest.raises(BenchConfigError) as info:
        config.default_size(str(tmp_path), "host", None)
    assert info.value.option == "size"


def test_no_room_for_a_default_size_says_the_room_there_is(capsys, tmp_path, monkeypatch):
    """The limit is said as it is (16 KiB, a quarter of a 64 KiB
    filesystem's free space), not first rounded down to whole MiB, which
    made every such limit "0 bytes"."""
    monkeypatch.setattr(config, "free_disk", lambda d: 64 * KiB)
    with pytest.raises(BenchConfigError) as info:
        config.default_size(str(tmp_path), "host", None)
    assert info.value.option == "size"
    assert str(info.value) == (f"not enough room for a benchmark file (a quarter of the free disk in {tmp_path} is "
                               "16 KiB; needs 16 MiB)")
    code, out, err = cli(capsys, "--host", "--mode", "read", "--dir", tmp_path)
    assert (code, out) == (2, "") and f"--size: {info.value}" in err, err
    # Just short of the minimum: in bytes, not a rounded "16.0 MiB".
    monkeypatch.setattr(config, "free_disk", lambda d: 4 * (16 * MiB - 4096))
    with pytest.raises(BenchConfigError, match=r" is 16773120 bytes; needs 16 MiB\)"):
        config.default_size(str(tmp_path), "host", None)
    monkeypatch.setattr(config, "free_disk", lambda d: 4 * (20 * MiB + 12345))
    assert config.default_size(str(tmp_path), "host", None) == (20 * MiB, f"a quarter of the free disk in {tmp_path}")
    assert leftovers(tmp_path) == []


def test_a_filesystem_that_reports_no_size_is_benchmarked_all_the_same(capsys, tmp_path, monkeypatch):
    """A filesystem that reports no blocks at all (a FUSE filesystem without
    statfs answers all zeros) has unknown free space, not none: each workload
    runs there (a full disk is said by its writes), the default size is not
    cut to nothing, and the document says the free space is unknown. One that
    reports its size and has too little free is still refused."""

    def statvfs(blocks, free):
        return lambda path: os.statvfs_result((4096, 4096, blocks, free, free, 0, 0, 0, 0, 255))

    monkeypatch.setattr(os, "statvfs", statvfs(0, 0))
    code, out, err = cli(capsys, "--host", "--size", "4M", "--mode", "read", "--threads", "1", "--runs", "3",
                         "--dir", tmp_path, "--json")
    assert code == 0, err
    assert json.loads(out)["machine"]["filesystem"]["free_bytes"] is None
    code, _, err = cli(capsys, "--host", "--files", "4", "--file-size", "4K", "--mode", "copy", "--runs", "3",
                       "--threads", "1", "--dir", tmp_path, "-q")
    assert code == 0, err
    monkeypatch.setattr(config, "available_memory", lambda: 100 * MiB)
    assert config.default_size(str(tmp_path), "host", None) == (25 * MiB, "a quarter of the available host memory")
    assert leftovers(tmp_path) == []

    monkeypatch.setattr(os, "statvfs", statvfs(1000, 10))
    code, _, err = cli(capsys, "--host", "--size", "4M", "--mode", "read", "--dir", tmp_path)
    assert code == 2 and "needs 8 MiB of disk" in err and f"{tmp_path} has 40 KiB free" in err, err
    code, _, err = cli(capsys, "--host", "--files", "4", "--file-size", "4K", "--mode", "copy", "--dir", tmp_path)
    assert code == 2 and "the tree, its copies and the write ceilings' file need up to" in err, err
    assert "has 40960 free" in err, err
    assert leftovers(tmp_path) == []


def test_a_small_file_keeps_the_default_random_read_sizes_that_fit_it(tmp_path):
    """--size below the largest default --io-size: the default sizes that fit
    the file are measured; a size the command line names that does not fit
    is still a usage error, naming it."""
    plan = config.resolve(BenchConfig(dir=str(tmp_path), memory="host", size=100 * KiB, modes=["randread"]))
    assert plan.io_sizes == [4096, 65536]
    plan = config.resolve(BenchConfig(dir=str(tmp_path), memory="host", size=4096, modes=["randread"]))
    assert plan.io_sizes == [4096]
    with pytest.raises(BenchConfigError, match="1 MiB is larger than the file"):
        config.resolve(BenchConfig(dir=str(tmp_path), memory="host", size=100 * KiB, modes=["randread"],
                                   io_sizes=[4096, MiB]))


@pytest.mark.parametrize("sizes", ["4K,64K,1M", "4096,65536,1048576"])
def test_io_sizes_given_are_each_measured_even_when_they_are_the_defaults(capsys, tmp_path, sizes):
    """--io-size spelled out is checked as any list is: the default list
    given for an 8 KiB file is refused for its 64 KiB, as --io-size 4K,64K
    is, not cut down to the 4 KiB that fits without a word."""
    code, out, err = cli(capsys, "--host", "--size", "8K", "--mode", "randread", "--threads", "1", "--ops", "100",
                         "--io-size", sizes, "--dir", tmp_path, "--json")
    assert code == 2, err
    assert json.loads(out)["ok"] is False
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "--io-size: 64 KiB is larger than the file (8 KiB)" in line, err
    assert leftovers(tmp_path) == []
    with pytest.raises(BenchConfigError, match="64 KiB is larger than the file") as info:
        config.resolve(BenchConfig(dir=str(tmp_path), memory="host", size=8 * KiB, modes=["randread"],
                                   io_sizes=list(config.DEFAULT_IO_SIZES)))
    assert info.value.option == "io_size"
    plan = config.resolve(BenchConfig(dir=str(tmp_path), memory="host", size=8 * KiB, modes=["randread"]))
    assert BenchConfig().io_sizes is None and plan.io_sizes == [4096]


def test_resolve_fills_in_the_defaults(tmp_path):
    plan = config.resolve(BenchConfig(dir=str(tmp_path), memory="host", modes=["randread", "read", "read"]))
    assert plan.modes == ["randread", "read"]
    assert plan.io_sizes == list(config.DEFAULT_IO_SIZES) and plan.runs == 3
    assert plan.size % MiB == 0 and plan.size <= config.DEFAULT_SIZE
    assert plan.threads == config.default_threads()[0]
    assert plan.memory == "host" and plan.device is None


def test_stats():
    from gdscp.bench.stats import percentile, spread

    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    values = sorted(float(v) for v in range(101))
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([1.0, 3.0], 50) == 2.0
    with pytest.raises(ValueError):
        spread([])


def _record(tool, mode, threads, gbps, p50=None, cache="hot", io_size=None, p99=None):
    record = {"tool": tool, "mode": mode, "cache": cache, "io_size": io_size, "threads": threads,
              "gb_per_s": {"median": gbps, "min": gbps, "max": gbps}}  # fmt: skip
    if p50 is not None:
        record["latency_us"] = {"p50": {"median": p50, "min": p50, "max": p50}}
    if p99 is not None:
        record["latency_us"]["p99"] = {"median": p99, "min": p99, "max": p99}
    return record


def test_comparisons_follow_their_definitions():
    doc = {
        "config": {"memory": "gpu"},
        "ceilings": {
            "pinned_h2d": {"available": True, "gb_per_s": {"median": 50.0}},
            "disk_direct_write": {"available": True, "gb_per_s": {"median": 2.0}},
            "disk_buffered_write": {"available": False, "reason": "x"},
        },
        "results": [
            _record("gdscp", "read", 1, 10.0),
            _record("gdscp", "read", 4, 40.0),
            _record("python", "read", None, 2.0),
            _record("kvikio", "read", 1, 5.0),
            _record("kvikio", "read", 4, 32.0),
            _record("gdscp", "write", 4, 1.5, cache=None),
            _record("gdscp", "randread", 4, 0.1, p50=20.0, io_size=4096, p99=40.0),
            _record("kvikio", "randread", 4, 0.1, p50=30.0, io_size=4096, p99=100.0),
            _record("preadv", "randread", None, 0.1, p50=10.0, io_size=4096, p99=20.0),
        ],
    }
    report.compare(doc)
    by = {(r["tool"], r["mode"], r["threads"]): r for r in doc["results"]}
    assert by[("gdscp", "read", 4)]["share_of_ceiling"] == 0.8
    assert by[("gdscp", "read", 4)]["factor"] == {"python": 20.0, "numpy_cupy": None, "kvikio": 1.25, "preadv": None}
    assert "factor_p99" not in by[("gdscp", "read", 4)]
    assert by[("gdscp", "read", 1)]["factor"]["kvikio"] == 2.0  # same thread count
    assert by[("gdscp", "write", 4)]["ceiling"] == "disk_direct_write"
    assert by[("gdscp", "write", 4)]["share_of_ceiling"] == 0.75
    assert by[("gdscp", "randread", 4)]["share_of_ceiling"] is None
    assert by[("gdscp", "randread", 4)]["factor"]["kvikio"] == 1.5  # p50 30 us / 20 us
    assert by[("gdscp", "randread", 4)]["factor"]["preadv"] == 0.5  # p50 10 us / 20 us
    assert by[("gdscp", "randread", 4)]["factor_p99"] == {"python": None, "numpy_cupy": None, "kvikio": 2.5,
                                                          "preadv": 0.5}  # fmt: skip
    rand = next(row for row in doc["summary"] if row["mode"] == "randread")
    assert rand["best"]["gdscp"]["p99_us"] == 40.0 and rand["factor_p99"]["kvikio"] == 2.5
    read = next(row for row in doc["summary"] if row["mode"] == "read")
    assert read["best"]["gdscp"] == {"threads": 4, "gb_per_s": 40.0}
    assert read["best"]["kvikio"]["threads"] == 4
    assert read["factor"]["kvikio"] == 1.25 and read["share_of_ceiling"] == 0.8


@pytest.mark.gpu
def test_gpu_run_measures_the_gpu_baselines_and_the_copy_ceiling(tmp_path):
    doc = runner.run_benchmark(
        BenchConfig(
            size=16 * MiB,
            memory="gpu",
            device=0,
            threads=[1, 4],
            io_sizes=[4096, MiB],
            random_ops=100,
            dir=str(tmp_path),
        )
    )
    assert doc["config"]["memory"] == "gpu" and doc["machine"]["gpu"]["devices"]
    assert doc["ceilings"]["pinned_h2d"]["available"] and doc["ceilings"]["pinned_d2h"]["available"]
    assert doc["ceilings"]["host_memcpy"]["available"] is False
    assert doc["baselines"]["numpy_cupy"]["available"] is True
    groups = {(r["mode"], r["cache"], r["io_size"]) for r in doc["results"]}
    for group in groups:
        tools_seen = {r["tool"] for r in doc["results"] if (r["mode"], r["cache"], r["io_size"]) == group}
        assert {"gdscp", "python", "numpy_cupy"} <= tools_seen
    assert all(r["memory"] == "gpu" for r in doc["results"])
    hot = next(row for row in doc["summary"] if row["mode"] == "read")
    assert hot["ceiling"]["name"] == "pinned_h2d" and hot["share_of_ceiling"] > 0
    assert leftovers(tmp_path) == []


def test_every_ratio_column_and_word_is_explained(capsys, tmp_path):
    code, out, err = cli(capsys, "--size", "1M", "--threads", "1", "--mode", "read,write", "--dir", tmp_path)
    assert code == 0, err
    headers = {word for word in out.split() if word in ("python", "numpy+cupy", "kvikio")}
    for name in headers:
        if f"x {name}" in out:
            assert f"x {name}: how many times faster gdscp is than" in out, name
    for word in ("hot:", "cold:", "of ceiling:", "GB/s:"):
        assert word in out, word
    if "host memory" in out.splitlines()[0]:
        assert "This run used host memory" in out


def test_the_json_says_why_this_memory_without_claiming_it_was_asked_for(capsys, tmp_path):
    args = ("--size", "1M", "--threads", "1", "--mode", "read", "--dir", tmp_path, "--json")
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    assert "asked for" not in json.loads(out)["config"]["memory_reason"]
    code, out, err = cli(capsys, *args, "--host")
    assert code == 0, err
    assert json.loads(out)["config"]["memory_reason"] == "host memory was asked for"


def test_only_drop_cache_drops_the_machines_page_cache(page_cache_folder, monkeypatch):
    """The disk's cold read ceilings drop the data file's own pages; the whole
    machine's page cache (as root) only when --drop-cache asks for it."""
    from gdscp.bench import files as bench_files

    tmp_path = page_cache_folder

    calls = []
    monkeypatch.setattr(bench_files, "drop_system_page_cache", lambda **kw: calls.append(kw) or False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    doc = runner.run_benchmark(small(tmp_path, modes=["read"]))
    assert "disk_direct_read" in doc["ceilings"] or "disk_buffered_read" in doc["ceilings"]
    assert calls == []
    runner.run_benchmark(small(tmp_path, modes=["read"], drop_cache=True))
    assert calls


@pytest.fixture
def in_memory_folder():
    """A writable directory on tmpfs (/dev/shm, where the machine has one);
    removed afterwards. Skipped where there is none."""
    for base in ("/dev/shm", "/run/user/%d" % os.getuid(), "/tmp"):
        if os.path.isdir(base) and os.access(base, os.W_OK) and mount_of(base)["filesystem"] == "tmpfs":
            folder = Path(tempfile.mkdtemp(prefix="gdscp-test-", dir=base))
            try:
                yield folder
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            return
    pytest.skip("no tmpfs directory here")


def test_cold_reads_are_refused_on_a_filesystem_in_memory(capsys, in_memory_folder):
    """tmpfs and ramfs keep their files in memory only: a dropped page cache
    leaves them where they are, so "cold" figures there would be hot ones
    under a cold label. --drop-cache is a usage error naming the filesystem,
    before any file is made; without it the disk's cold read ceilings are
    not measured, and say why."""
    for mode in ("read", "randread"):
        code, out, err = cli(capsys, "--host", "--size", "1M", "--mode", mode, "--drop-cache",
                             "--dir", in_memory_folder, "--json")
        assert code == 2, err
        doc = json.loads(out)
        assert "--drop-cache" in doc["error"] and "tmpfs" in doc["error"] and str(in_memory_folder) in doc["error"]
        assert os.listdir(in_memory_folder) == []
    with pytest.raises(BenchConfigError, match="tmpfs") as raised:
        runner.run_benchmark(small(in_memory_folder, modes=["read"], drop_cache=True))
    assert raised.value.option == "drop_cache"

    doc = runner.run_benchmark(small(in_memory_folder, modes=["read"], threads=[1]))
    for name in ("disk_direct_read", "disk_buffered_read"):
        assert doc["ceilings"][name]["available"] is False
        assert "tmpfs" in doc["ceilings"][name]["reason"]
    assert all(r["cache"] == "hot" for r in doc["results"])
    assert os.listdir(in_memory_folder) == []


def test_fresh_buffers_are_new_memory_every_run(tmp_path, monkeypatch):
    """Each run of the fresh-buffer group reads into memory of its own that
    nothing has touched (not the allocator's recycled memory)."""
    seen = []
    real = runner._fresh_memory

    def fresh(size):
        m = real(size)
        view = np.frombuffer(m, np.uint8)
        seen.append(bool(view.any()))
        del view
        return m

    monkeypatch.setattr(runner, "_fresh_memory", fresh)
    runner.run_benchmark(small(tmp_path, modes=["read"]))
    assert seen and not any(seen)


def test_files_workload_refuses_a_read_back_that_needs_more_memory_than_there_is(capsys, tmp_path, monkeypatch):
    """The read workload holds every byte of the tree at once: a tree larger
    than the host memory available is refused before anything is written,
    where it had been made and then exhausted the memory."""
    from gdscp.bench import many

    monkeypatch.setattr(many, "available_memory", lambda: 64 << 20)
    code, _, err = cli(capsys, "--host", "--files", "20", "--file-size", "2M", "--mode", "read", "--dir", tmp_path)
    assert code == 2 and "host memory" in err and "Traceback" not in err, err
    assert leftovers(tmp_path) == []
    # The copy alone holds no such buffer: not refused for it.
    code, _, err = cli(capsys, "--host", "--files", "20", "--file-size", "2M", "--mode", "copy", "--runs", "3",
                       "--dir", tmp_path)
    assert code == 0, err


def test_files_workload_counts_every_file_it_writes_against_the_free_disk(capsys, tmp_path, monkeypatch):
    """The space check counts every file the run writes: the tree, each
    run's copies, the write ceilings' file (at least 1 MiB, however small
    the tree) and the read's one file of the tree's bytes. A tree whose
    copies fit but whose ceiling file does not is refused before anything is
    written, not ended by a full disk halfway."""
    from gdscp.bench import many

    unit = os.statvfs(tmp_path).f_frsize
    data = 4 * 4096
    tree = 4 * -(-4096 // unit) * unit + 2 * unit  # and its root and its one folder
    one_file = -(-data // unit) * unit
    ceiling = -(-MiB // unit) * unit
    args = ["--host", "--files", "4", "--file-size", "4K", "--runs", "3", "--threads", "1", "--dir", tmp_path]
    cases = [("copy", tree + 6 * tree + ceiling, "the tree, its copies and the write ceilings' file"),
             ("copy,read", tree + 6 * tree + ceiling + one_file,
              "the tree, its copies, the write ceilings' file and one file of its bytes"),
             ("read", tree + one_file, "the tree and one file of its bytes")]
    for modes, need, what in cases:
        monkeypatch.setattr(many, "free_disk", lambda d, free=need - 1: free)
        code, out, err = cli(capsys, *args, "--mode", modes, "--json")
        assert code == 2, err
        doc = json.loads(out)
        assert doc["ok"] is False and doc["exit_code"] == 2
        assert doc["error"] == f"--files: {what} need up to {need} bytes; {tmp_path} has {need - 1} free"
        assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(many, "free_disk", lambda d: tree + one_file)
    code, out, err = cli(capsys, *args, "--mode", "read", "--json")
    assert code == 0, err
    assert json.loads(out)["config"]["bytes"] == data and leftovers(tmp_path) == []


def test_files_workload_counts_small_files_in_whole_allocation_units(capsys, tmp_path, monkeypatch):
    """A file takes whole allocation units of its filesystem (statvfs's
    f_frsize), a file of one byte a whole one: 250 such files are counted at
    250 units, not 250 bytes, and each directory of the tree (its root and
    one per 100 files) at one more, so that a disk with room for their bytes
    but not their blocks is refused before anything is written, not filled
    halfway. The figure matches what the files really take."""
    from gdscp.bench import many
    from gdscp.bench.tree import make_tree

    unit = os.statvfs(tmp_path).f_frsize
    tree = 250 * unit + (1 + 3) * unit
    need = tree + unit  # and the 250 bytes as one file
    args = ["--host", "--files", "250", "--file-size", "1", "--mode", "read", "--threads", "1", "--dir", tmp_path,
            "--json"]
    monkeypatch.setattr(many, "free_disk", lambda d: need - 1)
    code, out, err = cli(capsys, *args)
    assert code == 2, err
    doc = json.loads(out)
    assert doc["ok"] is False and doc["exit_code"] == 2
    assert doc["error"] == (f"--files: the tree and one file of its bytes need up to {need} bytes; "
                            f"{tmp_path} has {need - 1} free")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(many, "free_disk", lambda d: need)
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    assert json.loads(out)["config"]["bytes"] == 250 and leftovers(tmp_path) == []
    # Where the filesystem allocates blocks for such files, each takes one.
    made = make_tree(str(tmp_path / "t"), 250, 1, 1)
    taken = {os.stat(p).st_blocks * 512 for p in made.paths}
    assert taken <= {0, unit}, taken  # 0: kept inside the inode (tmpfs, inline data)
    shutil.rmtree(tmp_path / "t")
    assert files.allocation_unit(str(tmp_path)) == unit


@pytest.mark.parametrize("workload", [["--size", "4K", "--mode", "read"], ["--files", "3"]])
@pytest.mark.parametrize("where", [[], ["--dir", "."], ["--dir", "sub"]])
def test_a_removed_working_directory_is_a_dir_usage_error(capsys, tmp_path, monkeypatch, workload, where):
    """Run from a directory that has been removed, a relative --dir (the
    default, '.') leads nowhere: a usage error naming --dir and the
    directory, not a bare "No such file or directory"."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    code, out, err = cli(capsys, "--host", *workload, *where, "--json")
    assert code == 2, err
    doc = json.loads(out)
    name = where[1] if where else "."
    assert doc["ok"] is False and doc["exit_code"] == 2
    assert doc["error"] == f"--dir: {name}: cannot find the current working directory (No such file or directory)"
    assert list(tmp_path.iterdir()) == []


def test_the_headline_shows_a_directory_name_escaped_as_error_lines_do(capsys, tmp_path):
    """A line break or a byte that is not UTF-8 in --dir's name is written
    as an escape in the table's headline, as error lines write names; the
    JSON document keeps the name exact."""
    plain = tmp_path / "a\nb"
    plain.mkdir()
    code, out, err = cli(capsys, "--host", "--size", "4K", "--threads", "1", "--mode", "read", "--dir", plain)
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"gdscp benchmark: a 4 KiB file in {tmp_path}/a\\nb ("), out
    odd = tmp_path / os.fsdecode(b"a\nb\xff")
    odd.mkdir()
    shown = f"{tmp_path}/a\\nb\\xff"
    code, out, err = cli(capsys, "--host", "--size", "4K", "--threads", "1", "--mode", "read", "--dir", odd)
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"gdscp benchmark: a 4 KiB file in {shown} ("), out
    code, out, err = cli(capsys, "--host", "--files", "2", "--file-size", "1K", "--mode", "read", "--threads", "1",
                         "--dir", odd)
    assert code == 0, err
    assert out.splitlines()[0].startswith("gdscp benchmark: 2 files of 1 KiB (2 KiB in all) in "
                                          f"{shown}, through host memory"), out
    code, out, err = cli(capsys, "--host", "--size", "4K", "--threads", "1", "--mode", "read", "--dir", odd, "--json")
    assert code == 0, err
    assert json.loads(out)["machine"]["filesystem"]["dir"] == os.fspath(odd)
    assert list(odd.iterdir()) == []


def test_the_files_headline_gives_a_range_of_sizes_only_where_the_sizes_differ(capsys, tmp_path):
    """Files of one size are "N files of 1 KiB", not "1 KiB-1 KiB"; a range
    is "1 KiB-2 KiB", and one whose ends one label would round together is
    told apart ("1 KiB-1.001 KiB"). The JSON document keeps both numbers,
    equal or not."""
    for size, headline, low, high in (("1K", "3 files of 1 KiB (3 KiB in all)", 1024, 1024),
                                      ("1K-2K", "3 files of 1 KiB-2 KiB (", 1024, 2048),
                                      ("1024-1025", "3 files of 1 KiB-1.001 KiB (", 1024, 1025)):
        args = ["--host", "--files", "3", "--file-size", size, "--mode", "read", "--threads", "1", "--dir", tmp_path]
        code, out, err = cli(capsys, *args)
        assert code == 0, err
        assert out.splitlines()[0].startswith(f"gdscp benchmark: {headline}"), out
        code, out, err = cli(capsys, *args, "--json")
        assert code == 0, err
        assert "1 KiB-1 KiB" not in out
        config = json.loads(out)["config"]
        assert (config["low"], config["high"]) == (low, high)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("low, high, shown", [
    (1024, 1024, "1 KiB"),
    (1024, 2048, "1 KiB-2 KiB"),
    (1536, 2048, "1.50 KiB-2 KiB"),
    (1024, 1025, "1 KiB-1.001 KiB"),
    (1536, 1537, "1.5 KiB-1.501 KiB"),
    (5121, 5122, "5.001 KiB-5.002 KiB"),
    (1 << 30, (1 << 30) + (1 << 20), "1 GiB-1.001 GiB"),
    (1 << 30, (1 << 30) + 1, "1073741824 B-1073741825 B"),
    (1000, 1023, "1000 B-1023 B"),
])
def test_a_range_of_sizes_shows_two_labels_only_where_they_differ(low, high, shown):
    """Two sizes whose labels would read the same ("1 KiB-1 KiB" for 1024
    and 1025 bytes) get the decimals that tell them apart, or their exact
    counts where six decimals do not."""
    assert benchmark_command._size_range(low, high) == shown


@pytest.mark.parametrize("threads", ["0", "-1"])
def test_files_workload_refuses_a_thread_count_below_one(capsys, tmp_path, threads):
    code, _, err = cli(capsys, "--host", "--files", "5", "--threads", threads, "--dir", tmp_path)
    assert code == 2 and "threads" in err and "Traceback" not in err
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("args, named", [
    (["--files", "5", "--plot", "p.png"], "--plot"),
    (["--files", "5", "--size", "1M", "--ops", "5"], "--ops, --size"),
    (["--files", "5", "--drop-cache"], "--drop-cache"),
    (["--devices", "0", "--io-size", "4K"], "--io-size"),
    (["--devices", "0", "--mode", "write"], "--mode"),
    (["--size", "1M", "--mode", "read", "--io-size", "4K"], "--io-size"),
    (["--size", "1M", "--mode", "read,write", "--ops", "200"], "--ops"),
    (["--size", "1M", "--mode", "write", "--drop-cache"], "--drop-cache"),
])
def test_options_a_workload_would_not_use_are_refused(capsys, tmp_path, args, named):
    """The many-files and multi-GPU workloads refuse the one-file benchmark's
    options, and the one-file benchmark the random reads' options where
    --mode has none (or --drop-cache where it has no reads): exit 2, naming
    them, instead of running without them."""
    code, out, err = cli(capsys, "--host", *args, "--dir", tmp_path)
    assert code == 2 and named in err and "cannot be used with" in err, err
    assert not (tmp_path / "p.png").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("args, said", [
    (["--files", "5", "--mode", "read,write,randread"], "--mode: unknown mode 'write' with --files"),
    (["--files", "5", "--ops", "1000"], "--ops cannot be used with --files"),
    (["--files", "5", "--io-size", "4K,64K,1M"], "--io-size cannot be used with --files"),
    (["--size", "1M", "--mode", "read", "--io-size", "4K,64K,1M"], "--io-size cannot be used with --mode read"),
    (["--size", "1M", "--mode", "write", "--ops", "1000"], "--ops cannot be used with --mode write"),
])
def test_an_option_given_its_default_value_is_given_all_the_same(capsys, tmp_path, args, said):
    """An option spelled out with its default value (copied from --help) is
    refused where the workload would not use it, as any other value is: the
    many-files workload does not quietly measure copy,read for --mode
    read,write,randread."""
    code, out, err = cli(capsys, "--host", *args, "--dir", tmp_path)
    assert code == 2 and out == "" and said in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_tool_that_delivers_nothing_is_caught_after_others_filled_the_buffer(tmp_path, monkeypatch):
    """The benchmark's buffer holds the file's bytes once any tool has read
    it. A gdscp that claims every byte but moves none must still be caught:
    the checked windows are cleared before each tool's checked read."""
    real = tools.GdscpTool.read
    calls = []

    def lazy(self, handle, buf, size, offset, task_size):
        calls.append(size)
        base = getattr(buf, "base", None)
        if len(calls) == 1 or isinstance(getattr(base, "obj", base), mmap.mmap):
            # The first read is honest, and so are reads into fresh memory
            # (zeros, which no clearing is needed to tell from the file).
            return real(self, handle, buf, size, offset, task_size)
        return size

    monkeypatch.setattr(tools.GdscpTool, "read", lazy)
    with pytest.raises(Exception, match="wrong bytes"):
        runner.run_benchmark(small(tmp_path, modes=["read"], threads=[1, 2]))
    assert leftovers(tmp_path) == []



# -- sizes and options said as given -------------------------------------------------


def test_a_size_below_the_minimum_is_said_in_exact_bytes(capsys, tmp_path):
    """A size that is not a whole number of its unit is said in bytes: 4095
    is not "4.0 KiB", which would read as the limit it falls short of."""
    code, out, err = cli(capsys, "--size", "4095", "--dir", tmp_path, "--json")
    assert code == 2, err
    assert json.loads(out)["exit_code"] == 2
    assert "--size: 4095 bytes is too small: the file size must be at least 4 KiB" in err, err
    assert leftovers(tmp_path) == []
    assert config.human(4095, exact=True) == "4095 bytes" and config.human(4096, exact=True) == "4 KiB"
    assert config.human(1536, exact=True) == "1.5 KiB" and config.human(1 << 30) == "1 GiB"


@pytest.mark.parametrize("text", ["-1", "", " ", "1K-", "-"])
def test_a_file_size_that_is_not_a_size_is_quoted(capsys, tmp_path, text):
    """--file-size quotes what was given (not an empty piece of it), and an
    empty one is refused, not taken for the default."""
    code, out, err = cli(capsys, "--files", "5", "--file-size", text, "--host", "--dir", tmp_path, "--json")
    assert code == 2, err
    assert json.loads(out)["ok"] is False
    lines = [line for line in err.splitlines() if "error" in line]
    assert lines == [f"gdscp benchmark: error: --file-size: {text!r} is not a size or a range of sizes "
                     "(SIZE or SIZE-SIZE)"], err
    assert list(tmp_path.iterdir()) == []


def test_ranks_help_shows_the_extra_it_needs(capsys):
    """Rich reads "[mpi]" as markup unless escaped: the help says gdscp[mpi]."""
    code, out, err = cli(capsys, "--help")
    assert code == 0, err
    assert "gdscp[mpi]" in out.replace("\n", " ").replace("│", " ").replace(" ", ""), out


# -- the many-files document ---------------------------------------------------------


def test_files_memory_reason_is_why_not_that_it_was_asked_for(capsys, tmp_path):
    """Without --host the many-files document says why it used the memory it
    did (a GPU found, or none usable), as the one-file document does, and its
    copy runs without --host; with --host it says host memory was asked for."""
    args = ("--files", "5", "--file-size", "1K", "--mode", "copy", "--dir", tmp_path, "--json")
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    doc = json.loads(out)
    assert "asked for" not in doc["config"]["memory_reason"], doc["config"]
    gdscp_copy = doc["workloads"][0]["results"][0]
    assert gdscp_copy["tool"] == "gdscp" and "--host" not in gdscp_copy["what"], gdscp_copy
    if doc["config"]["memory"] == "host":
        assert doc["config"]["memory_reason"].startswith("no usable GPU ("), doc["config"]
    code, out, err = cli(capsys, *args, "--host")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["config"]["memory_reason"] == "host memory was asked for"
    assert "--host" in doc["workloads"][0]["results"][0]["what"]
    assert list(tmp_path.iterdir()) == []


def test_files_figures_agree_with_each_other():
    """Each record's median and GB/s come from the seconds it gives, to the
    nanosecond: a fast read's time is not cut to a few digits while its rate
    keeps four."""
    from gdscp.bench import many
    from gdscp.bench.stats import GB, spread

    seconds = [0.000123456789, 0.000234567891, 0.000345678912]
    record = many._record("gdscp", "w", 1000, seconds)
    assert record["seconds"] == [round(s, 9) for s in seconds]
    assert record["median_s"] == record["seconds"][1]
    assert record["gb_per_s"] == spread(1000 / s / GB for s in record["seconds"])


def test_files_document_figures_are_consistent_and_cp_is_the_best_baseline(capsys, tmp_path):
    code, out, err = cli(capsys, "--files", "20", "--file-size", "1K-4K", "--host", "--dir", tmp_path, "--json",
                         "--threads", "1")
    assert code == 0, err
    from gdscp.bench.stats import GB, spread

    doc = json.loads(out)
    for work in doc["workloads"]:
        for r in work["results"]:
            assert r["gb_per_s"] == spread(r["bytes"] / s / GB for s in r["seconds"]), r
            assert r["median_s"] == float(np.median(r["seconds"])), r
            assert all(s == round(s, 9) for s in r["seconds"])
    copy = doc["workloads"][0]
    assert [r.get("best") for r in copy["results"]] == [None, True]  # cp: the copy baseline's one record
    read = doc["workloads"][1]
    assert next(r for r in read["results"] if r["tool"] == "python")["best"] is True
    assert list(tmp_path.iterdir()) == []


def test_multi_gpu_thread_counts_are_at_least_the_gpus(tmp_path, monkeypatch):
    """A job spread over N GPUs needs N workers: a smaller count given is
    refused before anything is written, the default counts are raised to N."""
    from gdscp import defaults
    from gdscp.bench import multi

    config = multi.MultiConfig(devices=[0, 1, 2], size=MiB, dir=str(tmp_path), threads=[8, 2])
    with pytest.raises(BenchConfigError) as refused:
        multi.run_multi_benchmark(config)
    assert refused.value.option == "threads"
    assert str(refused.value) == "2 is too small: a job spread over 3 GPUs needs at least 3 worker threads"
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    with defaults.set("num_threads", 1):
        assert multi._threads(multi.MultiConfig(devices=[0, 1, 2])) == [3]
        assert multi._threads(multi.MultiConfig(devices=[0, 1])) == [2]
    with defaults.set("num_threads", 4):
        assert multi._threads(multi.MultiConfig(devices=[0, 1])) == [4]


def _fake_kvikio(monkeypatch, read):
    """A KvikIO of version 99.0 whose CuFile(path).read(buf) is ``read``."""
    kvikio = types.ModuleType("kvikio")
    kvikio.__version__ = "99.0"
    kvikio_defaults = types.ModuleType("kvikio.defaults")
    kvikio_defaults.set = lambda name, value: contextlib.nullcontext()
    kvikio.defaults = kvikio_defaults

    class CuFile:
        def __init__(self, path, mode="r"):
            self.path = path

        def read(self, buf):
            return read(self.path, buf)

        def close(self):
            pass

    kvikio.CuFile = CuFile
    monkeypatch.setitem(sys.modules, "kvikio", kvikio)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", kvikio_defaults)


def _files_read(tmp_path) -> dict:
    from gdscp.bench import many

    doc = many.run_files_benchmark(many.FilesConfig(files=4, low=1024, high=4096, modes=["read"], dir=str(tmp_path),
                                                    memory="host", threads=[1, 2]))
    (read,) = doc["workloads"]
    assert list(tmp_path.iterdir()) == []
    return read


def test_files_read_says_kvikio_absent_with_no_version(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvikio", None)  # import kvikio raises ImportError
    with pytest.raises(ImportError) as refused:
        import kvikio  # noqa: F401
    read = _files_read(tmp_path)
    assert read["kvikio"] == {"available": False, "version": None,
                              "reason": f"kvikio is not importable ({type(refused.value).__name__}: {refused.value})"}
    assert [(r["tool"], r["threads"]) for r in read["results"]] == [("gdscp", None), ("gdscp-one-file", None),
                                                                    ("python", None)]
    assert read["results"][0]["factor"] == {"python": read["results"][0]["factor"]["python"], "kvikio": None}


def test_files_read_drops_a_failing_kvikio_and_keeps_every_run_of_the_others(tmp_path, monkeypatch):
    def broken(path, buf):
        raise RuntimeError("no CUDA driver")

    _fake_kvikio(monkeypatch, broken)
    read = _files_read(tmp_path)
    assert read["kvikio"] == {"available": False, "version": "99.0",
                              "reason": "failed: RuntimeError: no CUDA driver"}
    assert [r["tool"] for r in read["results"]] == ["gdscp", "gdscp-one-file", "python"]
    assert all(len(r["seconds"]) == 3 for r in read["results"])
    assert read["results"][0]["factor"]["kvikio"] is None


def test_files_read_blames_a_failing_python_loop_on_python_alone(tmp_path, monkeypatch):
    """The Python loop failing in a timed run leaves KvikIO's entry and runs as they were."""
    from gdscp.bench import many

    def fill(path, buf):
        with open(path, "rb", buffering=0) as f:
            f.readinto(buf)

    _fake_kvikio(monkeypatch, fill)
    opened = []
    real_open = open

    def python_open(path, *args, **kwargs):
        if kwargs.get("buffering") == 0:  # only the Python loop opens files unbuffered
            opened.append(path)
            if len(opened) > 4:  # its warm-up round passes, its first timed run fails
                raise OSError(errno.EIO, "Input/output error")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(many, "open", python_open, raising=False)
    read = _files_read(tmp_path)
    assert read["kvikio"] == {"available": True, "version": "99.0", "reason": "importable"}
    assert [(r["tool"], r["threads"]) for r in read["results"]] == [("gdscp", None), ("gdscp-one-file", None),
                                                                    ("kvikio", 1), ("kvikio", 2)]
    assert all(len(r["seconds"]) == 3 for r in read["results"])
    assert read["results"][0]["factor"]["python"] is None and read["results"][0]["factor"]["kvikio"] > 0


@pytest.mark.parametrize("stdout, stderr, said", [
    ('{"command": "copy", "ok": false, "error": "cannot copy \'a\' to \'b\': No space left on device",'
     ' "exit_code": 1}', "gdscp copy: error: cannot copy 'a' to 'b': No space left on device\n",
     "gdscp copy failed (exit 1): cannot copy 'a' to 'b': No space left on device"),
    ("", "Traceback (most recent call last):\n  File \"x\", line 1\n" + "x" * 600 + "\nOSError: disk gone\n",
     "gdscp copy failed (exit 1): OSError: disk gone"),
    ("", "", "gdscp copy failed (exit 1): nothing said"),
])
def test_a_copy_that_fails_is_said_in_one_clean_line(capsys, tmp_path, monkeypatch, stdout, stderr, said):
    """A failed copy command is one line: its JSON document's error, else its
    last line on stderr; no class name, no line broken or cut mid-word."""
    from gdscp.bench import many

    real = subprocess.run

    def failing(argv, **kwargs):
        if "gdscp" in argv and "copy" in argv:
            return subprocess.CompletedProcess(argv, 1, stdout=stdout, stderr=stderr)
        return real(argv, **kwargs)

    monkeypatch.setattr(many.subprocess, "run", failing)
    code, out, err = cli(capsys, "--files", "5", "--file-size", "1K", "--mode", "copy", "--host", "--dir", tmp_path,
                         "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["ok"] is False and doc["exit_code"] == 1 and doc["error"] == said, doc
    assert err.splitlines()[-1] == f"gdscp benchmark: error: {said}", err
    assert "BenchError" not in err and "Traceback" not in err.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


def test_a_measurement_gone_wrong_is_a_plain_failure(capsys, tmp_path, monkeypatch):
    """A BenchError (a tool moved wrong bytes) is exit 1 and its message as it
    stands, in every workload."""
    def broken(self, handle, buf, size, offset, task_size):
        raise measure.BenchError("gdscp read 3 of 4 bytes")

    monkeypatch.setattr(tools.GdscpTool, "read", broken)
    code, out, err = cli(capsys, "--size", "1M", "--threads", "1", "--mode", "read", "--host", "--dir", tmp_path,
                         "--json")
    assert code == 1, err
    assert json.loads(out)["error"] == "gdscp read 3 of 4 bytes"
    assert err.splitlines()[-1] == "gdscp benchmark: error: gdscp read 3 of 4 bytes", err
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("workload", [["--size", "2M", "--threads", "1", "--mode", "read"],
                                      ["--files", "3", "--file-size", "2M", "--mode", "read"]])
def test_a_write_the_filesystem_refuses_says_where(tmp_path, workload):
    """A write error without a file name of its own (a full disk, a quota, a
    file size limit) names the directory the benchmark was writing in, not
    only the error: "File too large" alone does not say where."""
    import resource

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (MiB, MiB))  # Python ignores SIGXFSZ: writes fail with EFBIG

    done = subprocess.run([sys.executable, "-m", "gdscp", "benchmark", "--host", *workload, "--dir", str(tmp_path),
                           "--json"], capture_output=True, text=True, preexec_fn=limit_file_size, timeout=300)
    said = f"'{tmp_path}': {os.strerror(errno.EFBIG)}"
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["error"] == said, done.stdout
    assert done.stderr.splitlines()[-1] == f"gdscp benchmark: error: {said}", done.stderr
    assert list(tmp_path.iterdir()) == []


# -- cleanup through a second interrupt ---------------------------------------------


def _unlink_interrupted_once(monkeypatch, after: int = 0):
    """os.unlink raising KeyboardInterrupt (a Ctrl-C landing in the removal)
    on its call number ``after`` + 1, once."""
    real = os.unlink
    calls = []

    def unlink(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == after + 1:
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    return calls


def test_a_second_interrupt_in_the_removal_leaves_no_file(tmp_path, monkeypatch):
    def progress(done, total, description):
        if description.startswith("read hot: gdscp"):
            raise KeyboardInterrupt

    calls = _unlink_interrupted_once(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        runner.run_benchmark(small(tmp_path, modes=["read"]), progress=progress)
    assert len(calls) >= 2  # the interrupted removal was taken up again
    assert leftovers(tmp_path) == []


def test_an_interrupt_in_the_removal_after_a_clean_run_is_raised(tmp_path, monkeypatch):
    """Nothing else on its way: the removal ends, then the Ctrl-C is raised."""
    calls = _unlink_interrupted_once(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        with files.BenchFiles(str(tmp_path), 4096):
            pass
    assert len(calls) == 3 and leftovers(tmp_path) == []


def test_a_second_interrupt_in_the_files_workloads_removal_leaves_nothing(tmp_path, monkeypatch):
    from gdscp.bench import many

    def progress(done, total, description):
        if description.startswith("read: python"):
            raise KeyboardInterrupt

    calls = _unlink_interrupted_once(monkeypatch, after=3)  # inside the tree, part of it removed
    with pytest.raises(KeyboardInterrupt):
        many.run_files_benchmark(many.FilesConfig(files=30, low=1024, high=4096, modes=["read"], dir=str(tmp_path),
                                                  memory="host", threads=[1]), progress=progress)
    assert len(calls) > 4
    assert list(tmp_path.iterdir()) == []


# A child that runs the command line and puts Ctrl-C (or SIGTERM) at known
# points, from inside: argv[1] the signal, argv[2] where the first goes
# ("step:PREFIX", a progress step; "report", as a failure is reported),
# argv[3] where the second goes ("unlink:N", the Nth removal of a file of the
# benchmark's; "report"; "none"), the rest the command line.
SIGNAL_CHILD = r"""
import os, signal, sys
sig = getattr(signal, sys.argv[1])
first, second = sys.argv[2], sys.argv[3]
import gdscp.bench.runner as runner, gdscp.bench.many as many, gdscp.cli.output as output

def send(): os.kill(os.getpid(), sig)

def at_step(description):
    if first.startswith("step:") and description.startswith(first[5:]):
        send()

real_start, real_tick = runner._Steps.start, many._Run.tick
runner._Steps.start = lambda self, d: (at_step(d), real_start(self, d))[1]
many._Run.tick = lambda self, d: (at_step(d), real_tick(self, d))[1]

removed = []
real_unlink = os.unlink
def unlink(path, *args, **kwargs):
    if ".gdscp-bench" in os.fspath(path) or kwargs.get("dir_fd") is not None:
        removed.append(path)
        if second == f"unlink:{len(removed)}":
            send()
    return real_unlink(path, *args, **kwargs)
os.unlink = unlink

real_describe = output.describe
reports = []
def describe(exc):
    reports.append(exc)
    for where in (first, second):
        if where == "report":
            send()
    return real_describe(exc)
output.describe = describe

sys.argv = ["gdscp", *sys.argv[4:]]
from gdscp.cli.main import main
main()
"""


def signal_child(sig: str, first: str, second: str, *args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SIGNAL_CHILD, sig, first, second, *map(str, args)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
@pytest.mark.parametrize("workload", ["one file", "files"])
def test_a_second_signal_in_the_cleanup_leaves_nothing(tmp_path, sig, code, workload):
    """The first signal lands in a measurement, the second in the removal of
    the files it made (a plain loop, or shutil.rmtree, cut short, would leave
    the rest): nothing is left, the exit code and the JSON document are the
    first signal's, and no traceback."""
    if workload == "one file":
        args = ("benchmark", "--size", "1M", "--threads", "1", "--mode", "read", "--host", "--dir", tmp_path, "--json")
        first, second = "step:read hot: gdscp", "unlink:1"
    else:
        args = ("benchmark", "--files", "30", "--file-size", "1K", "--mode", "read", "--host", "--threads", "1",
                "--dir", tmp_path, "--json")
        first, second = "step:read: python", "unlink:3"
    done = signal_child(sig, first, second, *args)
    assert done.returncode == code, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == code
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_a_failure_is_reported_waits_for_the_report(tmp_path, sig):
    """A signal that lands while the command says why it failed does not cut
    the report short (SIGTERM's default action killed the process before the
    line and the document were out): both come out, with the failure's code."""
    done = signal_child(sig, "report", "none", "benchmark", "--files", "0", "--host", "--dir", tmp_path, "--json")
    assert done.returncode == 2, (done.returncode, done.stderr)
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and "--files" in doc["error"]
    assert done.stderr.splitlines() == [f"gdscp benchmark: error: {doc['error']}"], done.stderr


def test_two_signals_while_a_failure_is_reported_end_the_process(tmp_path):
    """The first waits for the report; a second ends the process at once."""
    done = signal_child("SIGTERM", "report", "report", "benchmark", "--files", "0", "--host", "--dir", tmp_path)
    assert done.returncode == 143, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr


def test_kvikio_task_size_is_read_without_its_deprecated_accessor(monkeypatch):
    """KvikIO 25.04 and later warn (FutureWarning) from defaults.task_size():
    the benchmark reads the setting through defaults.get() where KvikIO has it,
    so that comparing with KvikIO prints no warning of gdscp's making."""
    import types
    import warnings

    kvikio = types.ModuleType("kvikio")
    kvikio_defaults = types.ModuleType("kvikio.defaults")

    def task_size() -> int:
        warnings.warn("deprecated", FutureWarning, stacklevel=2)
        return 65536

    kvikio_defaults.task_size = task_size
    kvikio_defaults.get = lambda name: {"task_size": 65536}[name]
    kvikio.defaults = kvikio_defaults
    monkeypatch.setitem(sys.modules, "kvikio", kvikio)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", kvikio_defaults)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runner._library_task_size(types.SimpleNamespace(name="kvikio")) == 65536
