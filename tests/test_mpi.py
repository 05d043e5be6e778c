"""One job over several ranks (gdscp.mpi, gdscp.cli.ranks): the byte split,
the launcher detection, the engine's parts, and 4 ranks under mpiexec on one
machine (skipped without mpi4py and an mpiexec; CI installs gdscp[mpi] with
the mpich wheel)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdscp import bulk
from gdscp.mpi import launched, node_device
from gdscp.mpi.split import split_by_bytes

RANKS = 4
MiB = 1 << 20


# -- the split ----------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7])
@pytest.mark.parametrize(
    "sizes",
    [[], [0], [1], [0, 0, 0], [4095, 4096, 4097], [64 * MiB - 1, 64 * MiB, 64 * MiB + 1], [1] * 50 + [300 * MiB],
     [700 * MiB, 3, 5 * MiB + 1]],
)
def test_split_covers_every_byte_once(sizes, ranks):
    shares = split_by_bytes(sizes, ranks)
    assert len(shares) == ranks
    covered: dict[int, list[tuple[int, int]]] = {}
    for pieces in shares:
        seen = set()
        for p in pieces:
            assert p.index not in seen  # a rank's part of a file is one range
            seen.add(p.index)
            covered.setdefault(p.index, []).append((p.offset, p.length))
    assert sorted(covered) == list(range(len(sizes)))
    for index, ranges in covered.items():
        ranges.sort()
        pos = 0
        for offset, length in ranges:
            assert offset == pos
            pos += length
        assert pos == sizes[index]
        whole = [p.whole for pieces in shares for p in pieces if p.index == index]
        assert whole == [len(ranges) == 1] * len(ranges)


def test_split_shares_bytes_evenly_and_cuts_large_files():
    shares = split_by_bytes([1 << 30], 4)  # cut in 16 MiB chunks: each rank within one of its quarter
    assert all(abs(sum(p.length for p in s) - 256 * MiB) <= 16 * MiB for s in shares)
    assert sum(p.length for s in shares for p in s) == 1 << 30
    many = split_by_bytes([MiB] * 400, 4)
    assert [len(s) for s in many] == [100] * 4  # small files whole, by number
    assert all(p.whole for s in many for p in s)


def test_split_rejects_nonsense():
    with pytest.raises(ValueError):
        split_by_bytes([1], 0)
    with pytest.raises(ValueError):
        split_by_bytes([-1], 2)


# -- who am I -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, None),
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, (3, 8, 1)),
        ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2"}, (2, 4, 2)),
        ({"PMI_RANK": "0", "PMI_SIZE": "1"}, None),  # a world of one
        ({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "16", "SLURM_LOCALID": "1"}, (5, 16, 1)),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "16"}, None),  # a batch script, not an srun step
        ({"PMI_RANK": "2", "PMI_SIZE": "4", "GDSCP_MPI": "0"}, None),
        ({"PMI_RANK": "2", "PMI_SIZE": "4", "GDSCP_MPI": "N"}, None),  # the words every true/false setting takes
        ({"PMI_RANK": "2", "PMI_SIZE": "4", "GDSCP_MPI": "yes"}, (2, 4, 2)),
        ({"PMI_RANK": "2", "PMI_SIZE": "4", "GDSCP_MPI": "maybe"}, (2, 4, 2)),  # refused, by a rank that joins
        ({"PMI_RANK": "x", "PMI_SIZE": "4"}, None),
    ],
)
def test_launcher_environment(env, expected):
    got = launched(env)
    assert (None if got is None else (got.rank, got.size, got.local_rank)) == expected


@pytest.mark.parametrize("value", ["abc", "", " 7.5 ", "0", "-1", "-0.5", "nan", "inf", "-inf", "1e400", "1e300",
                                   "86401", "86400"])
def test_abort_after_takes_seconds_from_0_to_a_day(value):
    """GDSCP_MPI_ABORT_AFTER, the seconds a signalled rank waits for ranks that
    do not come before MPI_Abort: a bad value is an EnvironmentVariableError
    naming the variable, as for the other GDSCP_* variables, never a wait
    that cannot end (NaN, infinite) or a ValueError from deep in a wait."""
    from gdscp import EnvironmentVariableError
    from gdscp.mpi.comm import abort_after

    good = {"": 60.0, " 7.5 ": 7.5, "0": 0.0, "86400": 86400.0}
    env = {"GDSCP_MPI_ABORT_AFTER": value}
    if value in good:
        assert abort_after(env) == good[value]
        return
    with pytest.raises(EnvironmentVariableError) as caught:
        abort_after(env)
    assert caught.value.variable == "GDSCP_MPI_ABORT_AFTER"
    assert str(caught.value).startswith(f"GDSCP_MPI_ABORT_AFTER={value!r} is not valid: ")
    assert "seconds from 0 to 86400" in str(caught.value)


def test_gdscp_mpi_takes_true_or_false():
    from gdscp import EnvironmentVariableError
    from gdscp.mpi.launch import check_switch

    for value in ("0", "1", "off", "ON", "no", "y", "", " true "):
        check_switch({"GDSCP_MPI": value})
    check_switch({})
    with pytest.raises(EnvironmentVariableError, match=r"GDSCP_MPI='maybe' is not valid: .*takes 1 or 0"):
        check_switch({"GDSCP_MPI": "maybe"})


def test_node_device_is_local_rank_modulo_visible_gpus():
    env = {"OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}
    assert node_device(2, env) == 1
    assert node_device(4, env) == 3
    assert node_device(8, env) == 3
    assert node_device(1, env) == 0
    assert node_device(2, {}) == 0


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this system")
def test_a_rank_bound_to_few_cpus_is_warned(monkeypatch):
    """Bound to one core (Open MPI's default for two ranks), a rank's workers
    would share it: rank 0 says so and how to start the ranks; unbound, nothing."""
    import io

    from rich.console import Console

    from gdscp import defaults
    from gdscp.cli import ranks
    from gdscp.cli.output import Output

    def warnings() -> str:
        out = Output("copy")
        out.stderr = Console(file=io.StringIO(), width=300)
        ranks.warn_if_bound_tightly(out)
        return out.stderr.file.getvalue()

    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    with defaults.set("num_threads", 16):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
        text = warnings()
        assert "1 CPU only" in text and "16 workers" in text and "--bind-to none" in text
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))
        assert warnings() == ""
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))  # a NUMA node of 16 CPUs
        assert warnings() == ""


def test_import_gdscp_never_imports_mpi4py():
    code = "import gdscp, gdscp.cli.app, sys; gdscp.cli.app._register(gdscp.cli.app.COMMANDS); print('mpi4py' in sys.modules)"
    env = dict(os.environ, PMI_RANK="0", PMI_SIZE="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.strip() == "False", done.stderr


_BLOCK_MPI4PY = "import sys; sys.modules['mpi4py'] = None; from gdscp.cli.main import main; main()"


def test_a_launch_without_mpi4py_is_a_usage_error_not_n_copies(tmp_path):
    (tmp_path / "a").write_bytes(b"abc")
    env = dict(os.environ, PMI_RANK="1", PMI_SIZE="2")
    env.pop("GDSCP_MPI", None)
    argv = [sys.executable, "-c", _BLOCK_MPI4PY, "copy", str(tmp_path / "a"), str(tmp_path / "b")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "rank 1 of 2" in done.stderr and "gdscp[mpi]" in done.stderr and "GDSCP_MPI=0" in done.stderr
    assert not (tmp_path / "b").exists()
    env["GDSCP_MPI"] = "0"  # each process on its own, as without a launcher
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "b").read_bytes() == b"abc"


def test_a_launch_that_mpi_sees_as_a_world_of_one_is_a_usage_error(tmp_path):
    """Another MPI's launcher (its variables say rank 1 of 2) with an mpi4py
    whose MPI starts as a world of one: a usage error, not the whole job done
    by every rank; GDSCP_MPI=0 runs it on its own."""
    pytest.importorskip("mpi4py")
    (tmp_path / "a").write_bytes(b"abc")
    launchers = ("OMPI_", "PMIX_", "PMI_", "MV2_", "PALS_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launchers)}
    env.update(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2")
    env.pop("GDSCP_MPI", None)
    argv = [sys.executable, "-m", "gdscp", "copy", str(tmp_path / "a"), str(tmp_path / "b")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    if "Open MPI" in done.stderr and done.returncode != 2:
        pytest.skip("this mpi4py is Open MPI's: its variables make it a rank")
    assert done.returncode == 2, done.stderr
    assert "rank 1 of 2" in done.stderr and "world of one" in done.stderr and "GDSCP_MPI=0" in done.stderr
    assert not (tmp_path / "b").exists()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, "GDSCP_MPI": "0"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "b").read_bytes() == b"abc"


# -- 4 ranks under mpiexec -----------------------------------------------------------------


def _mpiexec() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()


def _hydra() -> bool:
    """Whether MPIEXEC is MPICH's launcher (Hydra)."""
    try:
        done = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in (done.stdout + done.stderr).upper()
_WHY = "needs mpi4py and mpiexec (pip install 'gdscp[mpi]' mpich)"
if MPIEXEC is None and os.environ.get("GDSCP_REQUIRE_MPI", "").strip().lower() in {"1", "true", "yes", "on"}:

    def needs_mpi(test):  # a failure, not a skip, where MPI is required (CI)
        def missing(*args, **kwargs):
            pytest.fail(f"GDSCP_REQUIRE_MPI=1 but this {_WHY}", pytrace=False)

        missing.__name__ = test.__name__
        return missing

else:
    needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason=_WHY)
GDSCP = [sys.executable, "-m", "gdscp"]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GDSCP_MPI_TEST", "PMI_", "OMPI_", "SLURM_"))}
    # Open MPI's mpiexec refuses to start as root unless told twice (containers
    # and CI machines often run as root); MPICH ignores these.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # Every rank runs on this machine: Open MPI needs no ssh/rsh agent for that.
    env.update(OMPI_MCA_plm="^rsh")
    # Open MPI 5 starts no more ranks than the machine has cores unless told
    # it may oversubscribe them (these tests start up to 4 ranks anywhere).
    env.update(PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    env.update(extra)
    return env


def _run(args: list[str], ranks: int = RANKS, **extra: str) -> subprocess.CompletedProcess:
    cmd = [MPIEXEC, "-n", str(ranks), *GDSCP, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(**extra))


def _tree(root: Path, big: int = 150 * MiB) -> dict[str, bytes]:
    files = {}
    rng = __import__("random").Random(7)
    for i, size in enumerate([0, 1, 4095, 4096, 4097, 100_000, MiB + 1] + [rng.randrange(1, 70_000) for _ in range(40)]):
        files[f"d{i % 3}/f{i}"] = os.urandom(size)
    files["big/large.bin"] = os.urandom(big)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "d0" / "link").symlink_to("f0")
    return files


def _temporaries(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.endswith(bulk.TEMPORARY_SUFFIX)]


def _check_what_exists(src: Path, dst: Path) -> int:
    """Every file that exists under ``dst`` equals its source, byte for byte; how many there are."""
    n = 0
    for p in dst.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert p.read_bytes() == (src / p.relative_to(dst)).read_bytes(), p
            n += 1
    return n


@needs_mpi
def test_tree_copy_on_four_ranks(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = _tree(src)
    done = _run(["copy", "-r", "--json", str(src), str(dst)])
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr  # each rank sizes its pool with defaults.set(), not a deprecated accessor
    doc = json.loads(done.stdout)  # one document: rank 0's alone
    assert doc["ok"] and doc["ranks"] == RANKS and doc["copied"] == len(files) + 1
    assert doc["memory"] == "host"  # no GPU unless one is named, as for one process
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data, rel
    assert os.readlink(dst / "d0" / "link") == "f0"
    large = [f for f in doc["files"] if f["destination"].endswith("large.bin")]
    assert len(large[0]["ranks"]) > 1  # the large file was cut among ranks
    assert not _temporaries(dst)


@pytest.mark.gpu
@needs_mpi
def test_tree_copy_on_four_ranks_through_a_gpu(tmp_path):
    """--device 0: every rank moves its files and ranges through that GPU's memory."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = _tree(src, big=40 * MiB)
    done = _run(["copy", "-r", "--json", "--device", "0", str(src), str(dst)])
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] and doc["memory"] == "gpu" and doc["device"] == 0 and doc["copied"] == len(files) + 1
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data, rel
    large = [f for f in doc["files"] if f["destination"].endswith("large.bin")]
    assert len(large[0]["ranks"]) > 1
    assert not _temporaries(dst)


@needs_mpi
def test_a_world_of_one_runs_as_a_single_process(tmp_path):
    data = os.urandom(3 * MiB + 1)
    (tmp_path / "a.bin").write_bytes(data)
    done = _run(["copy", "--json", str(tmp_path / "a.bin"), str(tmp_path / "b.bin")], ranks=1)
    assert done.returncode == 0, done.stderr
    assert "ranks" not in json.loads(done.stdout)
    assert (tmp_path / "b.bin").read_bytes() == data


@needs_mpi
def test_one_large_file_split_across_ranks(tmp_path):
    data = os.urandom(200 * MiB + 4097)
    (tmp_path / "a.bin").write_bytes(data)
    done = _run(["copy", "--json", "--verify", str(tmp_path / "a.bin"), str(tmp_path / "b.bin")])
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["files"][0]["ranks"] == [0, 1, 2, 3]
    assert doc["files"][0]["bytes"] == len(data)
    assert (tmp_path / "b.bin").read_bytes() == data
    assert not _temporaries(tmp_path)


@needs_mpi
def test_a_chunk_size_past_the_files_takes_no_more_gpu_memory_on_the_ranks(tmp_path):
    """--device 0 --chunk-size 1T for a 3MiB file, on two ranks over the
    libcuda stand-in (preloaded: the ranks' dlopen finds it, as in
    tests/standin): each rank's GPU staging is one chunk per worker, no chunk
    larger than the largest file, and the copy and the read succeed (each
    rank asked the GPU for 4TiB, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY")."""
    import standin

    try:
        libs = standin.build(tmp_path / "standin")
    except standin.Unavailable as exc:
        pytest.skip(f"cannot build the libcuda/libcufile stand-ins: {exc}")
    data = os.urandom(3 * MiB + 5)
    (tmp_path / "a.bin").write_bytes(data)
    preload = dict(LD_PRELOAD=f"{libs.cuda}:{libs.cufile}", GDSCP_NUM_THREADS="4")
    done = _run(["copy", "--json", "--device", "0", "--chunk-size", "1T", str(tmp_path / "a.bin"),
                 str(tmp_path / "b.bin")], ranks=2, **preload)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["memory"] == "gpu" and (tmp_path / "b.bin").read_bytes() == data
    done = _run(["read", "--json", "--verify", "--device", "0", "--chunk-size", "1T", str(tmp_path / "a.bin")],
                ranks=2, **preload)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files"][0]["bytes"] == len(data)
    assert not _temporaries(tmp_path)


@needs_mpi
def test_a_staging_past_a_ranks_gpu_is_refused_on_the_ranks_naming_the_option(tmp_path):
    """--chunk-size whose staging no rank's GPU can hold (600MiB for each
    of 32 workers; the libcuda stand-in's GPU says it has 16GiB free), on
    two ranks: exit 2 and the one line a process on its own says, naming
    --chunk-size, before anything is made or moved (each rank asked its GPU
    for the 18.75GiB, the copy made its tree first, and the GPU's own
    refusal would have named only a cuMemAlloc)."""
    import standin

    try:
        libs = standin.build(tmp_path / "standin")
    except standin.Unavailable as exc:
        pytest.skip(f"cannot build the libcuda/libcufile stand-ins: {exc}")
    src = tmp_path / "src" / "sparse.bin"
    src.parent.mkdir()
    with open(src, "wb") as f:
        f.truncate(600 * MiB)  # a hole: its size is all that counts here
    preload = dict(LD_PRELOAD=f"{libs.cuda}:{libs.cufile}", GDSCP_NUM_THREADS="32")
    said = ("error: --chunk-size: a chunk of 600.00 MiB for each of 32 workers needs 18.75 GiB of GPU 0's memory; "
            "16.00 GiB is free")
    for command, args in (("copy", ["-r", str(src.parent), str(tmp_path / "dst")]), ("read", [str(src)])):
        done = _run([command, *args, "--device", "0", "--chunk-size", "1G"], ranks=2, **preload)
        lines = [line for line in done.stderr.splitlines() if ": error: " in line]
        assert (done.returncode, lines) == (2, [f"gdscp {command}: {said}"]), done.stderr
        assert done.stdout == ""
    assert not (tmp_path / "dst").exists()
    assert not _temporaries(tmp_path)


@needs_mpi
def test_read_and_write_on_four_ranks(tmp_path):
    path = tmp_path / "w.bin"
    done = _run(["write", str(path), "--size", "130M", "--pattern", "random", "--seed", "5", "--verify", "--json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ranks"] == RANKS
    alone = subprocess.run([*GDSCP, "write", str(tmp_path / "one.bin"), "--size", "130M", "--pattern", "random",
                            "--seed", "5", "-q"], capture_output=True, text=True, timeout=300, env=_env())
    assert alone.returncode == 0, alone.stderr
    assert path.read_bytes() == (tmp_path / "one.bin").read_bytes()
    done = _run(["read", "--verify", "--json", str(path), str(tmp_path / "one.bin")])
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [f["bytes"] for f in doc["files"]] == [130 * MiB] * 2
    assert not _temporaries(tmp_path)


@needs_mpi
def test_a_rank_failing_mid_copy_fails_the_job_and_leaves_no_partial_file(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    done = _run(["copy", "-r", str(src), str(dst)], GDSCP_MPI_TEST_FAIL="2:1")
    assert done.returncode == 1, done.stderr
    assert "rank 2:" in done.stderr and str(src) in done.stderr
    assert not (dst / "big" / "large.bin").exists()  # rank 2 held a range of it
    _check_what_exists(src, dst)
    assert not _temporaries(dst)


@needs_mpi
def test_a_rank_failing_its_part_of_a_shared_file_names_the_destination(tmp_path):
    """A rank whose range of a file cut among the ranks fails: the engine's
    error names the destination, as one process says it, never the temporary
    file the ranks wrote into (a name the user never gave, and removed)."""
    data = os.urandom(100 * MiB + 5)
    src, dst = tmp_path / "a.bin", tmp_path / "b.bin"
    src.write_bytes(data)
    done = _run(["copy", "--json", str(src), str(dst)], ranks=2, GDSCP_MPI_TEST_FAIL="1:0")
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    (record,) = json.loads(done.stdout)["files"]
    said = record["error"]
    assert errors == [f"gdscp copy: error: {said}"]
    head = f"rank 1: cannot copy '{src}' to '{dst}' (its part at offset "
    assert said.startswith(head), said
    assert f"'{dst}' at offset " in said and os.strerror(errno.EIO) in said, said
    assert bulk.TEMPORARY_SUFFIX not in done.stderr + done.stdout
    assert not dst.exists() and not _temporaries(tmp_path)


@needs_mpi
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_the_launcher_leaves_no_partial_destination(tmp_path, sig, code):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    cmd = [MPIEXEC, "-n", str(RANKS), *GDSCP, "copy", "-r", str(src), str(dst)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(GDSCP_MPI_TEST_PAUSE="30"))
    # The large file, cut among the ranks, has a named temporary file (rank 0
    # makes it) for as long as its copy is in flight; the small files' may be
    # unnamed, and a link's is renamed within milliseconds.
    deadline = time.monotonic() + 120
    seen: list[str] = []
    while not seen and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
        seen = _temporaries(dst / "big") if (dst / "big").exists() else []
    if proc.poll() is not None or not _temporaries(dst / "big"):
        proc.terminate()
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"the launcher (exit {proc.returncode}) had no copy in flight; seen {seen}:\n{err}")
    time.sleep(0.5)  # the ranks are in their copies
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=120)
    if sig == signal.SIGINT and _hydra():
        # MPICH's launcher passes SIGINT on to the ranks and exits with their code.
        assert proc.returncode == code, err
        assert "interrupted" in err
    else:
        # The launcher's own code: for SIGTERM, and for SIGINT under Open MPI,
        # whose launcher ends the ranks with SIGTERM.
        assert proc.returncode != 0, err
    assert not (dst / "big" / "large.bin").exists()
    _check_what_exists(src, dst)
    assert not _temporaries(dst)
    umask = os.umask(0)
    os.umask(umask)
    for folder, _, _ in os.walk(dst):  # every directory made has its mode, none the 0700 it was made with
        want = stat.S_IMODE(os.stat(src / os.path.relpath(folder, dst)).st_mode) & ~umask
        assert stat.S_IMODE(os.stat(folder).st_mode) == want, folder


@needs_mpi
@pytest.mark.parametrize("rank", [1, 0])
def test_a_hangup_to_one_rank_ends_the_job_as_sigterm(tmp_path, rank):
    """SIGHUP to one rank, in the middle of its copy, ends the job as SIGTERM
    does (143), with nothing put in place: MPI's libraries that take SIGHUP
    for themselves as they start (UCX's debug log) do not keep it; stdout
    stays the one document."""
    src, dst, paused = tmp_path / "src", tmp_path / "dst", tmp_path / "paused"
    _tree(src, big=40 * MiB)
    paused.mkdir()
    cmd = [MPIEXEC, "-n", str(RANKS), *GDSCP, "copy", "-r", "--json", str(src), str(dst)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(GDSCP_MPI_TEST_PAUSE="20", GDSCP_MPI_TEST_PAUSED=str(paused)))
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not (paused / f"rank-{rank}").exists():
        time.sleep(0.02)
    if proc.poll() is not None or not (paused / f"rank-{rank}").exists():
        proc.terminate()
        _out, err = proc.communicate(timeout=120)
        pytest.fail(f"the launcher (exit {proc.returncode}) had no copy in flight on rank {rank}:\n{err}")
    os.kill(int((paused / f"rank-{rank}").read_text()), signal.SIGHUP)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "hung up" not in err, err  # (rank 0's SIGHUP ended the job with 1, "rank 0: hung up")
    doc = json.loads(out)
    assert doc["ok"] is False
    assert not (dst / "big" / "large.bin").exists()
    _check_what_exists(src, dst)
    assert not _temporaries(dst)


# Every rank runs the command line through this; rank 1 sends itself the
# signal named second while it loads the command line ("loading") or just
# before its command joins the others ("joining").
_INTERRUPTED_RANK = r"""
import os, signal, sys
where, sig = sys.argv[1], getattr(signal, sys.argv[2])
sys.argv = ["gdscp", *sys.argv[3:]]
if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == "1":
    if where == "loading":
        class Hook:
            def find_spec(self, name, path=None, target=None):
                if name == "typer":
                    sys.meta_path.remove(self)
                    os.kill(os.getpid(), sig)
                return None

        sys.meta_path.insert(0, Hook())
    else:
        from gdscp.cli import ranks

        join = ranks.join

        def interrupted_join(*args, **kwargs):
            os.kill(os.getpid(), sig)
            return join(*args, **kwargs)

        ranks.join = interrupted_join
from gdscp.cli.main import main
main()
"""


@needs_mpi
@pytest.mark.parametrize("where", ["loading", "joining"])
@pytest.mark.parametrize("sig, code, word", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated"),
                                             ("SIGHUP", 143, "terminated")])
def test_a_rank_interrupted_before_it_joins_ends_the_job(tmp_path, where, sig, code, word):
    """A rank interrupted before its command has joined the others (loading
    the command line, or just before joining) meets them all the same: the
    job ends with 130 (143 for SIGTERM, and for SIGHUP as docs/cluster.md
    says), said once by rank 0 (with --json the one document), nothing
    written; leaving at once, or killed by the signal, it left them waiting
    in MPI's start or ended the job with no document."""
    src = tmp_path / "a"
    src.write_bytes(os.urandom(MiB))
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-c", _INTERRUPTED_RANK, where, sig, "copy", "--json", str(src),
           str(tmp_path / "b")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == code, done.stderr
    # gdscp's one line (a launcher may add a report of its own, in its own words).
    said = [line for line in done.stderr.splitlines() if line.startswith("gdscp")]
    assert len(said) == 1 and said[0].endswith(word) and "rank 1" not in said[0], done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == code
    assert sorted(os.listdir(tmp_path)) == ["a"]


# Every rank runs the command line through this; as MPI starts (its
# signals held), the rank writes its process id to DIR/rank-N (DIR first).
_MARKED_START = r"""
import contextlib, os, sys
where = sys.argv[1]
sys.argv = ["gdscp", *sys.argv[2:]]
from gdscp.mpi import comm

kept = comm._signals_kept


@contextlib.contextmanager
def marked():
    with kept():
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
        path = os.path.join(where, f"rank-{rank}")
        with open(path + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".part", path)
        yield


comm._signals_kept = marked
from gdscp.cli.main import main
main()
"""


@needs_mpi
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"),
                                             (signal.SIGHUP, 143, "terminated")])
def test_a_rank_signalled_while_mpi_starts_ends(tmp_path, sig, code, word):
    """Ranks waiting in MPI's start for a rank that never comes (here one
    that ends at once): a signal to them ends them at once, each saying so
    in one line (the launcher may end the other first), with 130 or 143 (SIGHUP as SIGTERM under MPI), nothing
    written. With the signals held for the whole of MPI's start, only
    SIGKILL ended them."""
    src, marks = tmp_path / "a", tmp_path / "marks"
    src.write_bytes(os.urandom(MiB))
    marks.mkdir()
    cmd = [MPIEXEC, "-n", "1", sys.executable, "-c", "pass", ":", "-n", "2", sys.executable, "-c", _MARKED_START,
           str(marks), "copy", str(src), str(tmp_path / "b")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        # Each name comes whole, renamed from its ".part": wait for both names, not for any two entries.
        while proc.poll() is None and time.monotonic() < deadline and not all(
                (marks / name).exists() for name in ("rank-1", "rank-2")):
            time.sleep(0.02)
        assert sorted(os.listdir(marks)) == ["rank-1", "rank-2"], proc.poll()
        time.sleep(1)  # well inside MPI's start
        for name in ("rank-1", "rank-2"):
            os.kill(int((marks / name).read_text()), sig)
        _out, err = proc.communicate(timeout=30)
    except (subprocess.TimeoutExpired, AssertionError):
        os.killpg(proc.pid, signal.SIGKILL)
        _out, err = proc.communicate()
        pytest.fail(f"the ranks did not end on the signal:\n{err}")
    assert proc.returncode == code, err
    # (The launcher may end the second rank as soon as the first has left.)
    assert 1 <= err.count(f"gdscp: {word}\n") <= 2 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["a", "marks"]


# Every rank runs the command line through this; the ranks listed first
# (comma-separated) get the VARIABLE=VALUE that comes second.
_BAD_VARIABLE_ON_RANKS = r"""
import os, sys
bad, variable = sys.argv[1].split(","), sys.argv[2]
sys.argv = ["gdscp", *sys.argv[3:]]
if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) in bad:
    name, _, value = variable.partition("=")
    os.environ[name] = value
from gdscp.cli.main import main
main()
"""


def _run_or_kill(cmd: list[str], timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    """``cmd`` (a launcher and its ranks, in a process group of their own) run to
    its end; where it has not ended within ``timeout`` seconds, every process
    of it killed and the test failed: a hung job must not hang the tests, or
    leave its ranks behind. ``extra``: variables for every rank."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**extra),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job had not ended after {timeout} s:\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@needs_mpi
@pytest.mark.parametrize("bad, variable, said", [
    ("1", "GDSCP_NUM_THREADS=abc", "rank 1: GDSCP_NUM_THREADS='abc' is not valid"),
    ("0,2", "GDSCP_TASK_SIZE=lots", "ranks 0, 2: GDSCP_TASK_SIZE='lots' is not valid"),
    ("0,1,2", "GDSCP_NUM_THREADS=abc", "GDSCP_NUM_THREADS='abc' is not valid"),
    ("2", "GDSCP_MPI_ABORT_AFTER=nan", "rank 2: GDSCP_MPI_ABORT_AFTER='nan' is not valid"),
    ("1", "GDSCP_MPI=maybe", "rank 1: GDSCP_MPI='maybe' is not valid"),
])
@pytest.mark.parametrize("json_asked", [False, True])
def test_a_bad_variable_on_some_ranks_ends_the_job_said_once(tmp_path, bad, variable, said, json_asked):
    """A GDSCP_* variable that some ranks' environment has wrong: with it
    their command line cannot load, and they still meet the others, so that
    the job ends at once everywhere with exit 2, said once by rank 0 naming
    the variable and the ranks (unprefixed where every rank had it), with
    --json the one document, nothing written. Leaving on their own, they left
    the other ranks waiting for them in MPI's start for ever."""
    src = tmp_path / "a"
    src.write_bytes(os.urandom(MiB))
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-c", _BAD_VARIABLE_ON_RANKS, bad, variable, "copy", str(src),
           str(tmp_path / "b"), *(["--json"] if json_asked else [])]
    done = _run_or_kill(cmd)
    assert done.returncode == 2, done.stderr
    name = variable.partition("=")[0]
    # (Open MPI's launcher adds its own lines about a rank's non-zero exit.)
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and f": error: {said}: " in lines[0], done.stderr
    assert lines[0].count(name) == 2, done.stderr  # "NAME='value' is not valid: ...; NAME takes ..."
    if json_asked:
        doc = json.loads(done.stdout)
        assert doc["ok"] is False and doc["exit_code"] == 2 and doc["error"].startswith(said)
    else:
        assert done.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["a"]


@needs_mpi
def test_a_rank_with_a_bad_variable_asked_for_help_prints_it(tmp_path):
    """Asked for a command's help, the ranks print it and leave without
    meeting: a rank with a bad variable, which the help does not use, must
    not wait to meet them either, but print it too, the variable a warning."""
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-c", _BAD_VARIABLE_ON_RANKS, "1", "GDSCP_NUM_THREADS=abc", "copy",
           "--help"]
    done = _run_or_kill(cmd)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("gdscp copy: warning: GDSCP_NUM_THREADS='abc' is not valid") == 1, done.stderr
    assert "error" not in done.stderr, done.stderr
    assert done.stdout.count("Usage:") == 3, done.stdout


@needs_mpi
def test_a_bad_variable_on_one_rank_of_a_command_whose_option_value_is_a_help_flag():
    """``--dir -h`` names a directory: the command runs, so the rank with a
    bad variable meets the others and they end the job with it, exit 2, each
    reason said once by rank 0 (the others refuse to benchmark under a
    launcher), one JSON document. Taken for help, the command line left them
    waiting for that rank for ever."""
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-c", _BAD_VARIABLE_ON_RANKS, "1", "GDSCP_NUM_THREADS=abc",
           "benchmark", "--dir", "-h", "--size", "64K", "--json"]
    done = _run_or_kill(cmd, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert all(line.startswith("gdscp benchmark: error: ") for line in lines), done.stderr
    assert len(lines) == len(set(lines)) == 2, done.stderr
    assert sum(": error: rank 1: GDSCP_NUM_THREADS='abc' is not valid" in line for line in lines) == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2


# Every rank runs the command line through this: "interrupted plan" sends
# rank 0 a SIGINT once it has made 3 directories of its plan; "failed setup"
# makes rank 1 fail while it gets ready (rank 0 has made the directories).
_PLAN_STOPPED = r"""
import os, signal, sys
what = sys.argv[1]
sys.argv = ["gdscp", *sys.argv[2:]]
rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
if what == "interrupted plan" and rank == "0":
    from gdscp.cli import copy

    mkdir = copy._Copier._mkdir
    made = []

    def interrupted_mkdir(self, job):
        mkdir(self, job)
        made.append(job)
        if len(made) == 3:
            os.kill(os.getpid(), signal.SIGINT)

    copy._Copier._mkdir = interrupted_mkdir
elif what == "failed setup" and rank == "1":
    from gdscp.cli import options

    def failing(*args, **kwargs):
        raise OSError(5, "Input/output error")

    options.copy_memory = failing
from gdscp.cli.main import main
main()
"""


_RENAME_FAILS = r"""
import errno, os, sys
sys.argv = ["gdscp", *sys.argv[1:]]
if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == "0":
    from gdscp.cli import ranks

    def failing(tmp, dst):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), tmp, dst)

    ranks.commit = failing
from gdscp.cli.main import main
main()
"""


@needs_mpi
def test_a_shared_file_that_cannot_be_put_in_place_is_said_of_its_destination(tmp_path):
    """A file cut among the ranks whose rename into place fails (a directory
    put at its name meanwhile, say): one line naming the source, the
    destination and what failed, as one process says it, never the
    temporary file (which it named, "'DIR/.b.bin.XXXXXXXX.gdscp-tmp': Is a
    directory"); the temporary file removed."""
    data = os.urandom(100 * MiB + 5)
    src, dst = tmp_path / "a.bin", tmp_path / "b.bin"
    src.write_bytes(data)
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-c", _RENAME_FAILS, "copy", "--json", str(src), str(dst)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    said = (f"rank 0: cannot copy '{src}' to '{dst}': cannot rename the copy into place at '{dst}': "
            f"{os.strerror(errno.EISDIR)}")
    assert done.returncode == 1, done.stderr
    assert [line for line in done.stderr.splitlines() if ": error: " in line] == [f"gdscp copy: error: {said}"]
    (record,) = json.loads(done.stdout)["files"]
    assert record["ranks"] == [0, 1] and record["error"] == said
    assert not dst.exists() and not _temporaries(tmp_path)


@needs_mpi
@pytest.mark.parametrize("what, code", [("interrupted plan", 130), ("failed setup", 1)])
def test_a_copy_stopped_before_the_ranks_copy_leaves_no_directory_at_0700(tmp_path, what, code):
    """Rank 0's plan interrupted while it makes the directories, or another
    rank failing as it gets ready once they are made: as a process on its
    own, every directory made gets its mode (none is left at the 0700 it
    was made with), and no file or temporary file is there."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    for i in range(8):
        (src / f"d{i}" / "e").mkdir(parents=True)
        (src / f"d{i}" / "e" / "f").write_bytes(b"x" * i)
    os.chmod(src / "d1", 0o750)
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-c", _PLAN_STOPPED, what, "copy", "-r", str(src), str(dst)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == code, done.stderr
    assert dst.is_dir() and not [p for p in dst.rglob("*") if not p.is_dir()]
    umask = os.umask(0)
    os.umask(umask)
    for folder, _, _ in os.walk(dst):
        want = stat.S_IMODE(os.stat(src / os.path.relpath(folder, dst)).st_mode) & ~umask
        assert stat.S_IMODE(os.stat(folder).st_mode) == want, folder


@needs_mpi
def test_a_shared_file_replaces_a_destination_as_one_process_does(tmp_path):
    """A file cut among ranks, over an existing file of another owner: the copy
    keeps that owner and group (as root); through a link that points at
    nothing: refused, as by one process and GNU cp, the link left as it is."""
    big = tmp_path / "big.bin"
    data = os.urandom(24 * MiB)
    big.write_bytes(data)
    dangling = tmp_path / "dangling"
    os.symlink(tmp_path / "nowhere", dangling)
    done = _run(["copy", str(big), str(dangling), "--host"], ranks=3)
    assert done.returncode == 1 and "dangling symbolic link" in done.stderr, done.stderr
    assert os.path.islink(dangling) and not (tmp_path / "nowhere").exists()
    if os.geteuid() != 0:
        return
    owned = tmp_path / "owned.bin"
    owned.write_bytes(b"old")
    os.chown(owned, 1234, 1234)
    os.chmod(owned, 0o640)
    done = _run(["copy", str(big), str(owned), "--host"], ranks=3)
    assert done.returncode == 0, done.stderr
    st = os.stat(owned)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 1234, 0o640)
    assert owned.read_bytes() == data


@needs_mpi
def test_benchmark_times_the_copy_over_ranks_beside_one_process(tmp_path):
    argv = [*GDSCP, "benchmark", "--files", "30", "--file-size", "1K-8K", "--mode", "copy", "--ranks", "2",
            "--runs", "3", "--host", "--dir", str(tmp_path), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env())
    assert done.returncode == 0, done.stderr
    (work,) = json.loads(done.stdout)["workloads"]
    tools = [r["tool"] for r in work["results"]]
    assert tools == ["gdscp", "cp", "gdscp-mpi"]
    mpi = work["results"][2]
    assert mpi["ranks"] == 2 and len(mpi["seconds"]) == 3
    assert set(mpi["factor"]) == {"one_process", "one_process_command"}
    assert not list(tmp_path.iterdir())  # the tree and its copies are gone


@needs_mpi
def test_benchmark_ranks_are_one_job_whatever_gdscp_mpi_says(tmp_path):
    """GDSCP_MPI=0 where the benchmark runs does not reach the ranks it times:
    each on its own would copy the whole tree into the one destination."""
    argv = [*GDSCP, "benchmark", "--files", "20", "--file-size", "1K-8K", "--mode", "copy", "--ranks", "2",
            "--runs", "3", "--host", "--dir", str(tmp_path), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env(GDSCP_MPI="0"))
    assert done.returncode == 0, done.stderr
    (work,) = json.loads(done.stdout)["workloads"]
    assert [r["tool"] for r in work["results"]] == ["gdscp", "cp", "gdscp-mpi"]
    assert work["results"][2]["ranks"] == 2 and len(work["results"][2]["seconds"]) == 3
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("version, options", [
    ("mpiexec (Open MPI) 5.0.3", ["--bind-to", "none"]),
    ("mpiexec (OpenRTE) 4.1.6", ["--bind-to", "none"]),
    ("HYDRA build details:\n    Version: 4.2.0", ["--bind-to", "none"]),
    ("Some other MPI 1.0", []),
])
def test_benchmark_ranks_are_started_unbound_where_the_launcher_takes_it(tmp_path, version, options):
    """Open MPI binds each of at most two ranks to one core, where their
    workers would take turns: the benchmark starts its ranks with
    --bind-to none where the launcher is Open MPI's or MPICH's (which both
    take it), and gives another launcher none of their options."""
    from gdscp.bench import many

    launcher = tmp_path / "mpiexec"
    launcher.write_text(f"#!/bin/sh\ncat <<'EOF'\n{version}\nEOF\n")
    launcher.chmod(0o755)
    assert many._unbound(str(launcher)) == options
    assert many._unbound(str(tmp_path / "missing")) == []


_LOGGING_LAUNCHER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "mpiexec (Open MPI) 5.0.3"; exit 0; fi
printf '%s\\n' "$*" >> "{log}"
exec "{real}" "$@"
"""


@needs_mpi
def test_benchmark_ranks_run_as_their_record_says(tmp_path, monkeypatch):
    """The benchmark's ranks, under a launcher that says it is Open MPI's,
    are started with --bind-to none, and the record's "what" says so."""
    from gdscp.bench import many

    work, log = tmp_path / "work", tmp_path / "argv.log"
    work.mkdir()
    launcher = tmp_path / "mpiexec"
    launcher.write_text(_LOGGING_LAUNCHER.format(log=log, real=MPIEXEC))
    launcher.chmod(0o755)
    monkeypatch.setattr(many, "_mpiexec", lambda: str(launcher))
    for name, value in _env().items():
        monkeypatch.setenv(name, value)
    doc = many.run_files_benchmark(many.FilesConfig(files=12, low=1024, high=4096, modes=["copy"], runs=3,
                                                    dir=str(work), memory="host", ranks=2))
    (result,) = [r for w in doc["workloads"] for r in w["results"] if r["tool"] == "gdscp-mpi"]
    assert result["what"].startswith("mpiexec -n 2 --bind-to none gdscp copy -r ")
    runs = log.read_text().splitlines()
    assert len(runs) == 3 and all(run.startswith("-n 2 --bind-to none ") for run in runs), runs
    assert not list(work.iterdir())


def test_benchmark_ranks_needs_the_files_copy(tmp_path):
    argv = [*GDSCP, "benchmark", "--files", "3", "--mode", "read", "--ranks", "2", "--dir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 2 and "--ranks" in done.stderr and "copy" in done.stderr
    done = subprocess.run([*GDSCP, "benchmark", "--ranks", "2"], capture_output=True, text=True, timeout=120,
                          env=_env())
    assert done.returncode == 2 and "--ranks needs --files" in done.stderr


@needs_mpi
def test_benchmark_under_a_launcher_is_refused_once(tmp_path):
    """benchmark measures one process: under a launcher it is refused, exit
    2, said by rank 0 alone (one line, with --json one document), nothing written."""
    for extra in ([], ["--json"]):
        done = _run(["benchmark", "--files", "10", "--dir", str(tmp_path), *extra], ranks=2)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("benchmark measures one process") == 1, done.stderr
        assert "rank 1" not in done.stderr, done.stderr
        if extra:
            doc = json.loads(done.stdout)
            assert doc["ok"] is False and doc["exit_code"] == 2 and "measures one process" in doc["error"]
        else:
            assert done.stdout == ""
    assert not list(tmp_path.iterdir())


@needs_mpi
def test_options_of_one_process_are_usage_errors_under_mpi(tmp_path):
    """--devices and --replicate spread one process's files over its GPUs;
    under MPI each rank has its own. Refused, exit 2, said once (by rank 0),
    nothing written."""
    (tmp_path / "a").write_bytes(b"abc")
    for args in (["read", str(tmp_path / "a"), "--devices", "0,1"], ["read", str(tmp_path / "a"), "--replicate"],
                 ["copy", str(tmp_path / "a"), str(tmp_path / "b"), "--devices", "0,1"],
                 ["write", str(tmp_path / "c"), "--size", "1K", "--devices", "0,1"]):
        done = _run(args, ranks=2)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("work in one process") == 1, (args, done.stderr)
    assert sorted(os.listdir(tmp_path)) == ["a"]


@needs_mpi
def test_writes_of_one_process_only_are_refused_once_under_mpi(tmp_path):
    """A device, or several FILEs, under MPI: refused, exit 2, said once by
    rank 0 (with --json the one document), nothing written."""
    (tmp_path / "a").write_bytes(b"old")
    for args, text in ((["write", os.devnull, "--size", "1K"], "not a regular file"),
                       (["write", str(tmp_path / "a"), str(tmp_path / "b"), "--size", "1K"], "writes one FILE")):
        for extra in ([], ["--json"]):
            done = _run(args + extra, ranks=3)
            assert done.returncode == 2, (args, done.stderr)
            assert done.stderr.count(text) == 1 and "rank " not in done.stderr, (args, done.stderr)
            if extra:
                doc = json.loads(done.stdout)
                assert doc["ok"] is False and doc["exit_code"] == 2 and text in doc["error"]
            else:
                assert done.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["a"] and (tmp_path / "a").read_bytes() == b"old"


@needs_mpi
@pytest.mark.parametrize("first, second", [
    (["copy", "{a}", "{b}"], ["read", "{a}"]),
    (["write", "{b}", "--size", "3M", "--pattern", "random", "--seed", "1"],
     ["write", "{b}", "--size", "3M", "--pattern", "random", "--seed", "2"]),
])
def test_ranks_given_other_command_lines_are_refused_once(tmp_path, first, second):
    """Ranks started with other command lines than rank 0's (another command,
    which would wait in other agreements, or other options, which would
    write another job's bytes): exit 2, said once by rank 0 (with --json
    the one document), nothing written."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(os.urandom(3 * MiB))
    names = {"a": str(a), "b": str(b)}
    first, second = ([arg.format(**names) for arg in args] + ["--json"] for args in (first, second))
    cmd = [MPIEXEC, "-n", "1", *GDSCP, *first, ":", "-n", "2", *GDSCP, *second]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("another command line") == 1, done.stderr
    assert "ranks 1-2 were given another command line than rank 0" in done.stderr, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and "another command line" in doc["error"]
    assert sorted(os.listdir(tmp_path)) == ["a"]


@needs_mpi
@pytest.mark.parametrize("args", [["s.bin", "d.bin"], ["g1", "g2", "g3", "g4", "dd"]])
def test_ranks_started_in_other_working_directories_are_refused_once(tmp_path, args):
    """Ranks started in another working directory than rank 0's (an MPMD
    launch with another -wdir): the paths rank 0 plans from name other files
    there. Exit 2, said once by rank 0 with the ranks and both directories,
    nothing written; the job no longer puts one directory's bytes in the
    other's copy."""
    a, b = tmp_path / "A", tmp_path / "B"
    for d in (a, b):
        d.mkdir()
        for name in ["s.bin", "g1", "g2", "g3", "g4"]:
            (d / name).write_bytes(os.urandom(8_000_000 if name == "s.bin" else 300_000))
        (d / "dd").mkdir()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    line = [*GDSCP, "copy", "--verify", "--json", *args]
    cmd = [MPIEXEC, "-n", "2", "-wdir", str(a), *line, ":", "-n", "2", "-wdir", str(b), *line]
    done = _run_or_kill(cmd, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    assert f"ranks 2-3 were started in another working directory than rank 0 ('{b}', rank 0 '{a}')" in errors[0]
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and "working directory" in doc["error"]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def _own_files_command(tmp_path: Path) -> list[str] | None:
    """A command that runs its arguments with other files under the same
    names (a mount namespace of its own, each file of OTHER bind-mounted
    over its namesake in SRC, as a node-local file of another node): None
    where this machine refuses it (not root, no unshare)."""
    probe_dir = tmp_path / "probe"
    for name in ("src", "other"):
        (probe_dir / name).mkdir(parents=True)
        (probe_dir / name / "a").write_text(name)
    cmd = ["unshare", "-m", "sh", "-c", 'for f in "$OTHER"/*; do mount --bind "$f" "$SRC/${f##*/}" || exit 1; '
           'done && exec "$@"', "sh"]
    try:
        done = subprocess.run([*cmd, "cat", str(probe_dir / "src" / "a")], capture_output=True, text=True,
                              timeout=30, env={**os.environ, "OTHER": str(probe_dir / "other"),
                                               "SRC": str(probe_dir / "src")})
    except (OSError, subprocess.SubprocessError):
        return None
    shutil.rmtree(probe_dir)
    return cmd if done.returncode == 0 and done.stdout == "other" else None


@needs_mpi
@pytest.mark.parametrize("whole", [False, True])
def test_a_rank_that_sees_another_source_than_rank_0_fails_that_file(tmp_path, whole):
    """Ranks 2-3 see other files than rank 0 under the sources' absolute
    names (files local to their node): each such file fails, naming the rank
    and how its file differs from rank 0's, nothing put in place, exit 1;
    every file that does land is rank 0's source byte for byte. Before,
    the copy mixed both files' bytes (a shared file) or put the other
    node's file in place (whole files), verified, with exit 0."""
    src, other, dst = tmp_path / "src", tmp_path / "other", tmp_path / "dst"
    src.mkdir()
    other.mkdir()
    dst.mkdir()
    names = ["g1", "g2", "g3", "g4"] if whole else ["s.bin"]
    for name in names:
        (other / name).write_bytes(os.urandom(300_000 if whole else 8_000_000))
        (src / name).write_bytes(os.urandom(300_000 if whole else 8_000_000))
    wrap = _own_files_command(tmp_path)
    if wrap is None:
        pytest.skip("needs unshare -m and bind mounts (root)")
    target = dst if whole else dst / "s.bin"
    line = [*GDSCP, "copy", "--verify", "--json", *(str(src / n) for n in names), str(target)]
    # env, not MPICH's -env: the same under any launcher.
    cmd = [MPIEXEC, "-n", "2", *line, ":", "-n", "2", "env", f"OTHER={other}", f"SRC={src}", *wrap, *line]
    done = _run_or_kill(cmd, timeout=120)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    failed = [f for f in doc["files"] if f["status"] != "copied"]
    assert failed and doc["ok"] is False, doc
    for f in failed:
        assert f["status"] == "failed" and " sees another " in f["error"], f
        rank = f["error"].split(":")[0]
        assert rank in ("rank 2", "rank 3") and f"{rank} sees another '{f['source']}' than rank 0 (" in f["error"]
        assert "modified " in f["error"] and not os.path.exists(f["destination"])
    for f in doc["files"]:
        if f["status"] == "copied":
            assert Path(f["destination"]).read_bytes() == Path(f["source"]).read_bytes()
    assert sorted(p.name for p in dst.iterdir()) == sorted(Path(f["destination"]).name for f in doc["files"]
                                                           if f["status"] == "copied")


@needs_mpi
def test_a_rank_that_sees_another_file_than_rank_0_fails_its_read(tmp_path):
    """Ranks 2-3 see another file than rank 0 under the name read (a file
    local to their node, of another size): the file fails, each of those
    ranks named with its range and how its file differs, exit 1, not
    verified. Before, each rank read (and verified) its range of its own
    file, and the job said every byte was read and matched."""
    src, other = tmp_path / "src", tmp_path / "other"
    src.mkdir()
    other.mkdir()
    (src / "s.bin").write_bytes(os.urandom(8_000_000))
    (other / "s.bin").write_bytes(os.urandom(8_000_001))
    seen = os.stat(src / "s.bin")
    os.utime(other / "s.bin", ns=(seen.st_atime_ns, seen.st_mtime_ns))  # only the size differs
    wrap = _own_files_command(tmp_path)
    if wrap is None:
        pytest.skip("needs unshare -m and bind mounts (root)")
    path = str(src / "s.bin")
    line = [*GDSCP, "read", "--host", "--verify", "--json", path]
    cmd = [MPIEXEC, "-n", "2", *line, ":", "-n", "2", "env", f"OTHER={other}", f"SRC={src}", *wrap, *line]
    done = _run_or_kill(cmd, timeout=120)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["ok"], doc["verified"]) == (False, False)
    (record,) = doc["files"]
    offsets = {rank: piece.offset for rank, (piece,) in enumerate(split_by_bytes([8_000_000], 4))}
    said = [f"rank {r}: cannot read '{path}' (from offset {offsets[r]}): rank {r} sees another '{path}' than "
            f"rank 0 (size 8000001, rank 0's 8000000)" for r in (2, 3)]
    assert record["status"] == "failed" and record["error"] in said, record
    assert [line for line in done.stderr.splitlines() if ": error: " in line] == [
        f"gdscp read: error: {s}" for s in said]


@needs_mpi
def test_a_rank_that_sees_another_directory_than_rank_0_fails_the_write(tmp_path):
    """Ranks 2-3 see another directory than rank 0 under FILE's (one local
    to their node): they cannot find the temporary file rank 0 made in it,
    and say so of FILE and its directory, never of the temporary file (a
    name the user never gave, removed); nothing is put in place, exit 1."""
    other = tmp_path / "other"
    (other / "out").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    wrap = _own_files_command(tmp_path)
    if wrap is None:
        pytest.skip("needs unshare -m and bind mounts (root)")
    path, folder = str(tmp_path / "out" / "w.bin"), str(tmp_path / "out")
    line = [*GDSCP, "write", "--host", path, "--size", "8M"]
    cmd = [MPIEXEC, "-n", "2", *line, ":", "-n", "2", "env", f"OTHER={other}", f"SRC={tmp_path}", *wrap, *line]
    done = _run_or_kill(cmd, timeout=120)
    assert done.returncode == 1, done.stderr
    assert [line for line in done.stderr.splitlines() if ": error: " in line] == [
        f"gdscp write: error: rank {r}: cannot write '{path}': rank {r} sees another '{folder}' than rank 0 "
        "(rank 0's temporary file is not in it)" for r in (2, 3)]
    assert os.listdir(tmp_path / "out") == [] and os.listdir(other / "out") == []


@needs_mpi
@pytest.mark.parametrize("how", ["a write fails", "another source"])
def test_fail_fast_stops_every_rank_once_a_file_fails(tmp_path, how):
    """--fail-fast, as in one process: once a file fails, no file that is not
    in place yet is copied, on any rank. Rank 1 fails its first file (a write
    that fails, or a source it sees otherwise than rank 0), while rank 0's
    workers wait at their first chunk until their job is cancelled: they are,
    and rank 1's other file is not copied either. Before, rank 0 copied its
    files (once its workers were let go), and rank 1 its other file where the
    check had failed the first."""
    src, other, dst = tmp_path / "src", tmp_path / "other", tmp_path / "dst"
    for d in (src, other, dst):
        d.mkdir()
    names = ["g1", "g2", "g3", "g4"]  # g1 and g2 rank 0's, g3 and g4 rank 1's
    assert [[p.index for p in share] for share in split_by_bytes([300_000] * 4, 2)] == [[0, 1], [2, 3]]
    for name in names:
        (src / name).write_bytes(os.urandom(300_000))
    line = [*GDSCP, "copy", "--fail-fast", "--json", *(str(src / n) for n in names), str(dst)]
    if how == "a write fails":
        cmd = [MPIEXEC, "-n", "2", *line]
        env = {"GDSCP_MPI_TEST_FAIL": "1:0"}
    else:
        (other / "g3").write_bytes(b"other")
        seen = os.stat(src / "g3")
        os.utime(other / "g3", ns=(seen.st_atime_ns, seen.st_mtime_ns))  # only the size differs
        wrap = _own_files_command(tmp_path)
        if wrap is None:
            pytest.skip("needs unshare -m and bind mounts (root)")
        cmd = [MPIEXEC, "-n", "1", *line, ":", "-n", "1", "env", f"OTHER={other}", f"SRC={src}", *wrap, *line]
        env = {}
    done = _run_or_kill(cmd, timeout=120, GDSCP_MPI_TEST_HOLD="0", **env)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    status = {Path(f["source"]).name: (f["status"], f["error"]) for f in doc["files"]}
    cancelled = ("cancelled", "not copied: an earlier file failed (--fail-fast)")
    assert status["g1"] == status["g2"] == cancelled, status
    if how == "a write fails":
        failed = [n for n in ("g3", "g4") if status[n][0] == "failed"]
        assert failed and all(status[n] == cancelled for n in ("g3", "g4") if n not in failed), status
        assert all(status[n][1].startswith(f"rank 1: cannot copy '{src / n}' to '{dst / n}': ") for n in failed)
    else:
        assert status["g4"] == cancelled, status
        assert status["g3"] == ("failed", f"rank 1: cannot copy '{src / 'g3'}' to '{dst / 'g3'}': rank 1 sees "
                                          f"another '{src / 'g3'}' than rank 0 (size 5, rank 0's 300000)"), status
    assert (doc["copied"], doc["failed"]) == (0, 4)
    assert os.listdir(dst) == []


@needs_mpi
@pytest.mark.parametrize("where", ["walk", "plan"])
def test_fail_fast_over_ranks_copies_nothing_after_a_file_fails_before_the_copy(tmp_path, where):
    """As one process: with --fail-fast, a file that fails before any rank
    copies (a source missing in rank 0's walk; a file cut among the ranks
    whose destination is a directory, found as rank 0 shares the files out)
    stops the copy there; the other files are reported not copied. Before,
    the ranks copied them."""
    dst = tmp_path / "dst"
    dst.mkdir()
    (tmp_path / "a").write_bytes(os.urandom(1000))
    (tmp_path / "big").write_bytes(os.urandom(8_000_000))  # cut among both ranks
    cancelled = "not copied: an earlier file failed (--fail-fast)"
    if where == "walk":
        names = [str(tmp_path / n) for n in ("missing", "a", "big")]
        expected = [(names[0], "failed", f"cannot stat '{names[0]}': No such file or directory"),
                    (names[1], "cancelled", cancelled), (names[2], "cancelled", cancelled)]
    else:
        (dst / "big").mkdir()
        names = [str(tmp_path / n) for n in ("a", "big")]
        said = f"cannot overwrite directory '{dst / 'big'}' with non-directory '{names[1]}'"
        expected = [(names[0], "cancelled", cancelled), (names[1], "failed", said)]
    done = _run(["copy", "--fail-fast", "--json", *names, str(dst)], ranks=2)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert [(f["source"], f["status"], f["error"]) for f in doc["files"]] == expected
    # Nothing copied: only the directory in the way, empty.
    assert [str(p.relative_to(dst)) for p in dst.rglob("*")] == ([] if where == "walk" else ["big"])


# Every rank runs this: an alarm sounded by the ranks named first, then one
# sounded by rank 0 alone; the agreement that ends each phase must take in
# every word (a word left over would be heard in the next phase, one too many
# awaited would hang the job).
_ALARMS = r"""
import sys
from gdscp import mpi
world = mpi.world()
first = [int(r) for r in sys.argv[1].split(",")]
alarm = world.alarm()
if world.rank in first:
    alarm.sound()
while not alarm.sounded():
    pass
world.agree(0)
alarm = world.alarm()
world.barrier()
heard_early = alarm.sounded()
world.barrier()
if world.rank == 0:
    alarm.sound()
while not alarm.sounded():
    pass
statuses = world.agree(0, data=heard_early)
if world.rank == 0:
    print([s.data for s in statuses])
"""


@needs_mpi
@pytest.mark.parametrize("first", ["1", "1,2", "0,1,2"])
def test_an_alarm_is_closed_by_its_phases_agreement(first):
    done = _run_or_kill([MPIEXEC, "-n", "3", sys.executable, "-c", _ALARMS, first], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[False, False, False]\n"


@needs_mpi
@pytest.mark.parametrize("first, second", [
    (["copy", "--help"], ["copy", "{a}", "{b}"]),
    (["copy", "{a}", "{b}"], ["copy", "-h"]),
    (["--version"], ["copy", "{a}", "{b}"]),
    (["info"], ["copy", "{a}", "{b}"]),
])
def test_ranks_given_help_version_or_info_among_a_copy_are_refused_once(tmp_path, first, second):
    """A rank given --help, --version or info among ranks given a copy (an
    MPMD launch): it meets the others and the job ends with the usage error
    of ranks given other command lines, exit 2, said once by rank 0, nothing
    copied. Printing its help and leaving, it left them waiting in MPI's
    start for ever."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(os.urandom(MiB))
    first, second = ([arg.format(a=a, b=b) for arg in args] for args in (first, second))
    done = _run_or_kill([MPIEXEC, "-n", "1", *GDSCP, *first, ":", "-n", "2", *GDSCP, *second], timeout=60)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "ranks 1-2 were given another command line than rank 0" in errors[0], done.stderr
    assert sorted(os.listdir(tmp_path)) == ["a"]


@needs_mpi
def test_ranks_all_given_help_or_the_version_print_it():
    """Every rank given the same --help or --version: each prints it, exit 0."""
    done = _run_or_kill([MPIEXEC, "-n", "2", *GDSCP, "copy", "--help"], timeout=60)
    assert done.returncode == 0 and done.stdout.count("Usage:") == 2, done.stderr
    done = _run_or_kill([MPIEXEC, "-n", "2", *GDSCP, "--version"], timeout=60)
    assert done.returncode == 0 and done.stdout.count("gdscp ") == 2, done.stderr


_DEAD_TEMPORARY = r"""
import os, sys
from gdscp import bulk
fd, path = bulk.create_temporary(sys.argv[1])
print(path, flush=True)
os.kill(os.getpid(), 9)
"""


@needs_mpi
def test_a_copy_over_ranks_removes_dead_runs_temporaries(tmp_path):
    """As a process on its own: a copy into a directory first removes the
    temporary files that a killed run left there (their writer is gone)."""
    dst = tmp_path / "dst"
    dst.mkdir()
    dead = subprocess.run([sys.executable, "-c", _DEAD_TEMPORARY, str(dst / "big.bin")], capture_output=True,
                          text=True, timeout=60)
    left = dead.stdout.strip()
    assert dead.returncode == -signal.SIGKILL and os.path.exists(left)
    src = tmp_path / "big.bin"
    data = os.urandom(24 * MiB)
    src.write_bytes(data)
    done = _run(["copy", str(src), str(dst), "--host"], ranks=2)
    assert done.returncode == 0, done.stderr
    assert (dst / "big.bin").read_bytes() == data
    assert not os.path.exists(left) and not _temporaries(dst)


@needs_mpi
def test_a_copy_over_ranks_leaves_its_sources_named_like_temporaries(tmp_path):
    """As a process on its own: the cleaning of the directories written into
    leaves the job's own sources, however named (a dead run's leftover being
    rescued beside itself)."""
    src = tmp_path / ".data.abcdefgh.gdscp-tmp"
    data = os.urandom(5000)
    src.write_bytes(data)
    done = _run(["copy", str(src), str(tmp_path / "rescued"), "--host"], ranks=2)
    assert done.returncode == 0, done.stderr
    assert src.read_bytes() == data and (tmp_path / "rescued").read_bytes() == data


@needs_mpi
def test_a_read_over_ranks_goes_on_past_a_file_it_cannot_read(tmp_path):
    """As one process: with several files, one that cannot be read is a failed
    file in its place, said once, and the others are read; exit status 1."""
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(os.urandom(300_000))
    names = [str(tmp_path / "a"), str(tmp_path / "missing"), str(tmp_path / "b")]
    done = _run(["read", "--host", *names, "--json"], ranks=2)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert [(f["path"], f["status"], f["bytes"]) for f in doc["files"]] == [
        (names[0], "done", 300_000), (names[1], "failed", 0), (names[2], "done", 300_000)]
    assert done.stderr.count("missing") == 1, done.stderr


@needs_mpi
def test_a_failure_before_the_ranks_connect_gives_one_json_document(tmp_path):
    """Every rank checks its command line before the ranks connect; the ranks
    that fail there connect all the same, so rank 0 says the failure once for
    all of them (with --json, the one document) before any rank leaves (a
    launcher that ends the job when one rank fails cannot cut it short)."""
    (tmp_path / "d").mkdir()
    done = _run(["write", str(tmp_path / "d"), "--size", "1K", "--json"], ranks=3)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and "directory" in doc["error"]
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert lines == [f"gdscp write: error: cannot write '{tmp_path / 'd'}': it is a directory"], done.stderr


@needs_mpi
def test_a_command_line_refused_on_every_rank_gives_one_json_document(tmp_path):
    """An option value Typer refuses fails before the command runs, on every
    rank alike: one line, ending as a single process's does with where to
    read more, one document, exit status 2."""
    done = _run(["write", str(tmp_path / "x"), "--size", "lots", "--json"], ranks=3)
    assert done.returncode == 2, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and "'lots' is not a size" in doc["error"]
    assert "--help" not in doc["error"]
    lines = [line for line in done.stderr.splitlines() if "is not a size" in line]
    assert len(lines) == 1 and lines[0].endswith(" (see 'gdscp write --help')"), done.stderr
    assert not (tmp_path / "x").exists()


def test_what_the_ranks_said_is_said_once_per_text():
    """Rank 0 prints each text once, naming the ranks it came from, and
    unprefixed where every rank said it."""
    from gdscp.mpi.comm import Status, said

    statuses = [Status(r, 1, m, None) for r, m in enumerate([
        ["rank 0: disk full"], ["rank 1: disk full"], [], ["rank 3: disk full", "rank 3: cannot read 'a'"],
        ["rank 4: disk full"]])]
    assert said(statuses) == ["ranks 0-1, 3-4: disk full", "rank 3: cannot read 'a'"]
    assert said([Status(r, 2, [f"rank {r}: bad option"], None) for r in range(3)]) == ["bad option"]
    assert said([Status(0, 1, ["rank 0: gone"], None)]) == ["rank 0: gone"]


# -- a rank's signals: noted at once, raised only inside a phase's own work ------------------


class _World:
    """What ranks' signal handling uses of a World, without MPI."""

    rank = 1

    def __init__(self):
        self.interrupted = 0
        self.signals = 0

    def note_signal(self, code):
        self.interrupted = self.interrupted or code
        self.signals += 1


@pytest.fixture
def gate(monkeypatch):
    """ranks' signal handling installed as a rank's join installs it, for one test."""
    from gdscp.cli import ranks

    signals = ranks._Signals()
    monkeypatch.setattr(ranks, "_signals", signals)
    world = _World()
    signals.world = world
    signals.install()
    yield ranks, world
    signals.uninstall()


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 143)])
def test_a_signal_between_phases_waits_for_the_next_agreement(gate, sig, code):
    """Outside a phase's work a signal raises nothing (a rank leaving there
    would leave the others waiting for it in an agreement): it is noted, and
    the next phase's work does not start."""
    ranks, world = gate
    os.kill(os.getpid(), sig)
    for _ in range(1000):  # the handler runs between two bytecodes: surely within these
        pass
    assert world.interrupted == code and world.signals == 1
    ran = []
    assert ranks._run(world, ran.append, 1) == (code, [], None)
    assert ran == []


def test_a_signal_stops_a_phases_work_and_the_job_it_started(gate, tmp_path):
    """Inside a phase's work a signal raises, as in a process on its own; a
    bulk job the work started and had not waited on yet is stopped, its
    temporary file gone."""
    ranks, world = gate
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a silent writer: the copy stays in flight
    started = []

    def step():
        started.append(bulk.copy_files([(fifo, tmp_path / "out")]))
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)

    try:
        assert ranks._run(world, step) == (130, [], None)
        assert started[0].done()
    finally:
        os.close(held)
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def test_work_that_must_finish_runs_to_its_end_through_a_signal(gate):
    """Putting files in place (or removing them) and the report are not cut
    short: the signal is noted for the next agreement."""
    ranks, world = gate
    done = []

    def step():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        done.append(True)

    assert ranks._run(world, step, interruptible=False) == (0, [], None)
    assert done == [True] and world.interrupted == 143
