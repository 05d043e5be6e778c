"""The command line against the files and inputs cp and dd users throw at it:
devices, FIFOs, procfs files, trailing slashes, NUL bytes, impossible sizes,
unreadable sources, quiet runs and signals at awkward moments."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from gdscp import memory
from gdscp.cli import atomic
from gdscp.cli.app import run

from test_cli import cli, cli_json, random_file, temp_files

KiB = 1024
MiB = 1 << 20


def fake_null(tmp_path: Path) -> Path:
    """A character device like /dev/null made inside ``tmp_path`` (root only), so a
    regression that replaces it harms nothing."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as exc:
        pytest.skip(f"cannot make a device node here: {exc.strerror}")
    return node


class FifoReader:
    """Collects what is written into a FIFO, on a thread."""

    def __init__(self, path: Path):
        self.data = b""
        self._path = path
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with open(self._path, "rb") as f:
            self.data = f.read()

    def join(self) -> bytes:
        self._thread.join(10)
        assert not self._thread.is_alive(), "the FIFO was never closed by its writer"
        return self.data


def fifo_writer(path: Path, data: bytes) -> threading.Thread:
    def write() -> None:
        with open(path, "wb") as f:
            f.write(data)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


# -- destinations that are not regular files -------------------------------------------


def test_copy_into_a_character_device_writes_in_place(capsys, tmp_path):
    node = fake_null(tmp_path)
    random_file(tmp_path / "small.bin", 1000)
    code, out, err = cli(capsys, "copy", tmp_path / "small.bin", node)
    assert code == 0, err
    assert stat.S_ISCHR(os.stat(node).st_mode), "the device was replaced by a regular file"
    assert temp_files(tmp_path) == []


def test_write_to_a_character_device_writes_in_place(capsys, tmp_path):
    node = fake_null(tmp_path)
    code, doc, err = cli_json(capsys, "write", node, "--size", "9M", "--host")
    assert code == 0, err
    assert doc["bytes"] == 9 * MiB
    assert stat.S_ISCHR(os.stat(node).st_mode)


def test_copy_into_a_fifo_writes_in_place(capsys, tmp_path):
    data = random_file(tmp_path / "src.bin", 3 * MiB + 5)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    code, out, err = cli(capsys, "copy", tmp_path / "src.bin", fifo, "--host", "--chunk-size", "1M")
    assert code == 0, err
    assert reader.join() == data
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_preserve_into_a_fifo_keeps_its_mode_and_times_and_says_so(capsys, tmp_path):
    """-p into a FIFO (written in place): the bytes go through, the FIFO
    keeps its own mode and times (who may write to it is its owner's), and
    a warning says so, where -p was silently passed over."""
    data = random_file(tmp_path / "src.bin", 5000)
    os.chmod(tmp_path / "src.bin", 0o751)
    os.utime(tmp_path / "src.bin", ns=(10**18, 10**18))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo, 0o600)
    before = os.stat(fifo)
    reader = FifoReader(fifo)
    code, out, err = cli(capsys, "copy", "-p", tmp_path / "src.bin", fifo, "--host")
    assert code == 0, err
    assert reader.join() == data
    assert [line for line in err.splitlines() if ": warning: " in line] == [
        f"gdscp copy: warning: --preserve: '{fifo}' keeps its own mode and times: it is a pipe or FIFO, not a copy "
        f"of '{tmp_path / 'src.bin'}'"]
    after = os.stat(fifo)
    assert stat.S_IMODE(after.st_mode) == 0o600 and after.st_mtime_ns != 10**18 and after.st_mode == before.st_mode


def test_write_to_a_fifo_writes_the_pattern_in_place(capsys, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    code, out, err = cli(capsys, "write", fifo, "--size", "2M", "--pattern", "seq", "--host", "--chunk-size", "1M")
    assert code == 0, err
    assert reader.join() == memory.pattern(2 * MiB, "seq").tobytes()
    assert "not fsynced" in out


def test_verify_into_a_fifo_is_refused_before_writing(capsys, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, out, err = cli(capsys, "write", fifo, "--size", "1M", "--verify", "--host")
    assert code == 2 and "not a regular file" in err


# -- trailing slashes, NUL bytes, operands -------------------------------------------------


def test_copy_to_a_missing_directory_with_a_trailing_slash(capsys, tmp_path):
    random_file(tmp_path / "f1", 100)
    code, out, err = cli(capsys, "copy", tmp_path / "f1", str(tmp_path / "nodir") + "/")
    assert code == 1
    assert "Not a directory" in err
    assert not (tmp_path / "nodir").exists()


def test_copy_to_a_file_named_with_a_trailing_slash(capsys, tmp_path):
    random_file(tmp_path / "f1", 100)
    old = random_file(tmp_path / "existing", 50, seed=9)
    code, out, err = cli(capsys, "copy", tmp_path / "f1", str(tmp_path / "existing") + "/")
    assert code == 1 and "Not a directory" in err
    assert (tmp_path / "existing").read_bytes() == old


@pytest.mark.parametrize("command", ["copy", "read", "write", "info"])
def test_paths_with_a_nul_byte_are_refused(capsys, tmp_path, command):
    victim = tmp_path / "victim"
    old = random_file(victim, 100)
    bad = str(victim) + "\0suffix"
    args = {
        "copy": ["copy", victim, bad],
        "read": ["read", bad],
        "write": ["write", bad, "--size", "1K"],
        "info": ["info", bad],
    }[command]
    code, out, err = cli(capsys, *args)
    assert code == 2 and "NUL" in err
    assert victim.read_bytes() == old


def test_names_that_are_not_utf8_copy_read_and_write(capsys, tmp_path):
    """Linux names are bytes: Python hands the ones that are not UTF-8 over as
    str with surrogates, and every command must take them to the same bytes."""
    root = os.fsencode(tmp_path)
    src = os.path.join(root, b"tree-\xfa")
    os.makedirs(os.path.join(src, b"sub-\xfb"))
    first = os.path.join(src, b"a-\xff\nz.bin")
    second = os.path.join(src, b"sub-\xfb", b"b-\xfe.bin")
    data = {first: os.urandom(70_001), second: os.urandom(1)}
    for name, payload in data.items():
        with open(name, "wb") as f:
            f.write(payload)

    dst = os.path.join(root, b"copy-\xfc")
    code, out, err = cli(capsys, "copy", "-r", os.fsdecode(src), os.fsdecode(dst), "--host", "--chunk-size", "8K")
    assert code == 0, err
    for name, payload in data.items():
        with open(dst + name[len(src):], "rb") as f:
            assert f.read() == payload
    assert sorted(os.listdir(dst)) == sorted(os.listdir(src))
    # The JSON document (ASCII, one to stdout) names each file exactly: its
    # bytes that are not UTF-8 as lone surrogates, as os.fsdecode gives them.
    capsys.readouterr()
    code = run(["copy", "-r", os.fsdecode(src), os.fsdecode(dst + b"-json"), "--host", "--json"])
    out = capsys.readouterr().out
    assert code == 0 and out.isascii() and "\\udcfa" in out
    doc = json.loads(out)
    assert sorted(os.fsencode(f["destination"]) for f in doc["files"]) == sorted(
        dst + b"-json" + name[len(src):] for name in data)

    code, doc, err = cli_json(capsys, "read", os.fsdecode(first), os.fsdecode(second), "--host", "--verify")
    assert code == 0, err
    assert [f["path"] for f in doc["files"]] == [os.fsdecode(first), os.fsdecode(second)]
    assert [f["bytes"] for f in doc["files"]] == [70_001, 1]

    outs = [os.path.join(root, b"w1-\xfd"), os.path.join(root, b"w2-\xfd")]
    for names in (outs[:1], outs):  # one FILE through CuFile, several as one job
        code, out, err = cli(capsys, "write", *map(os.fsdecode, names), "--size", "5000", "--host")
        assert code == 0, err
        assert "w1-\\xfd" in out  # the table shows the byte as ls -b does
        code, doc, err = cli_json(capsys, "write", *map(os.fsdecode, names), "--size", "5000", "--host")
        assert code == 0, err
        assert [os.fsencode(p) for p in doc.get("paths", [doc.get("path")])] == names
        for name in names:
            with open(name, "rb") as f:
                assert f.read() == memory.pattern(5000, "zeros").tobytes()
    assert temp_files(tmp_path) == []

    missing = os.fsdecode(os.path.join(root, b"missing-\xfe"))
    code, doc, err = cli_json(capsys, "read", missing, "--host")
    assert code == 1 and doc["error"] == f"cannot read '{missing}': No such file or directory"
    code, out, err = cli(capsys, "read", missing, "--host")
    shown = os.path.join(str(tmp_path), "missing-\\xfe")  # on stderr, as ls -b shows it
    assert code == 1 and err == f"gdscp read: error: cannot read '{shown}': No such file or directory\n"


def unescaped(text: str) -> bytes:
    r"""The bytes of a name as a message or table shows it: the inverse of
    the escapes gdscp writes (``\\``, ``\n``, ``\t``, ``\r``, ``\xNN``)."""
    singles = {"\\": b"\\", "n": b"\n", "t": b"\t", "r": b"\r"}
    return re.sub(rb"\\(x[0-9a-f]{2}|.)", lambda m: (bytes([int(m[1][1:], 16)]) if len(m[1]) == 3
                                                       else singles[m[1].decode()]), os.fsencode(text))


def test_names_in_messages_and_tables_are_unambiguous(capsys, tmp_path):
    r"""A name holding a backslash is not shown as the one holding what its
    escape would stand for (a backslash and "n" against a line break, the
    four characters of "\xff" against that byte), nor one holding an emoji
    code (":smile:") as the emoji: every shown name gives its bytes back.
    The JSON document keeps the name exact."""
    root = os.fsencode(tmp_path)
    names = [b"miss\\nname", b"miss\nname", b"miss\\xff", b"miss\xff", b"back\\\\slash", b"x:smile:y", b"\\"]
    lines = []
    for name in names:
        path = os.fsdecode(os.path.join(root, name))
        code, doc, err = cli_json(capsys, "read", "--host", path)
        assert code == 1 and doc["error"] == f"cannot read '{path}': No such file or directory", doc
        code, out, err = cli(capsys, "read", "--host", path)
        assert code == 1 and err.count("\n") == 1, err
        assert err.startswith("gdscp read: error: cannot read '") and err.endswith("': No such file or directory\n")
        lines.append(err)
        assert unescaped(err[len("gdscp read: error: cannot read '"):-len("': No such file or directory\n")]) == \
            os.path.join(root, name)
    assert len(set(lines)) == len(names), lines
    assert [line.split("/")[-1] for line in lines] == [
        "miss\\\\nname': No such file or directory\n", "miss\\nname': No such file or directory\n",
        "miss\\\\xff': No such file or directory\n", "miss\\xff': No such file or directory\n",
        "back\\\\\\\\slash': No such file or directory\n", "x:smile:y': No such file or directory\n",
        "\\\\': No such file or directory\n"]

    # A table's names too.
    files = [os.path.join(root, b"t-\\n"), os.path.join(root, b"t-\n"), os.path.join(root, b"t-:smile:")]
    for path in files:
        with open(path, "wb") as f:
            f.write(b"abc")
    code, out, err = cli(capsys, "read", "--host", *map(os.fsdecode, files))
    assert code == 0, err
    rows = [line for line in out.splitlines() if "t-" in line]
    assert [unescaped(row.split()[1]) for row in rows] == files, out


def test_copy_without_a_destination_names_it(capsys, tmp_path):
    code, out, err = cli(capsys, "copy", tmp_path / "a")
    assert code == 2
    assert "missing destination operand" in err and "'SRC'" not in err


@pytest.mark.parametrize("dst", ["/proc/self/gdscp-link", "/proc/sys/vm/gdscp-link", "/sys/kernel/gdscp-link"])
def test_a_link_copied_into_procfs_or_sysfs_is_refused_naming_the_destination(capsys, tmp_path, dst):
    """-r copies a symbolic link as a link, made beside DST under a
    temporary name and renamed over it; procfs and sysfs take no new name
    (whoever runs it). One line naming DST and what could not be done, never
    the temporary name, a file the user never named (it said "'target' ->
    '/proc/self/.gdscp-link.XXXXXXXX.gdscp-tmp': No such file or directory")."""
    if not os.path.isdir(os.path.dirname(dst)):
        pytest.skip(f"no {os.path.dirname(dst)} here")
    os.symlink("target", tmp_path / "link")
    code, out, err = cli(capsys, "copy", "-r", tmp_path / "link", dst, "-q")
    (line,) = [line for line in err.splitlines() if ": error: " in line]
    said = (f"gdscp copy: error: cannot create symbolic link '{dst}': no temporary link can be made beside it, to "
            "be renamed over it (")
    assert code == 1 and line.startswith(said) and line.endswith(")"), err
    assert ".gdscp-tmp" not in err
    assert not os.path.lexists(dst)


# -- sources whose size the kernel does not tell ---------------------------------------------


@pytest.mark.parametrize("proc", ["/proc/version", "/proc/self/mounts"])
def test_copy_of_a_procfs_file_reads_to_the_end(capsys, tmp_path, proc):
    if not os.path.exists(proc) or os.stat(proc).st_size != 0:
        pytest.skip(f"{proc} is not a zero-size procfs file here")
    code, out, err = cli(capsys, "copy", proc, tmp_path / "copy.txt", "--host")
    assert code == 0, err
    copied = (tmp_path / "copy.txt").read_bytes()
    assert len(copied) > 0
    if proc == "/proc/version":  # /proc/self/mounts is this process's and may differ in a child
        assert copied == Path(proc).read_bytes()


def test_read_of_a_procfs_file_counts_its_bytes(capsys, tmp_path):
    if os.stat("/proc/version").st_size != 0:
        pytest.skip("/proc/version reports its size here")
    code, doc, err = cli_json(capsys, "read", "/proc/version", "--host", "--verify")
    assert code == 0, err
    assert doc["files"][0]["bytes"] == len(Path("/proc/version").read_bytes())


def test_read_from_dev_zero_reads_the_length_asked(capsys):
    code, doc, err = cli_json(capsys, "read", "/dev/zero", "--length", "10M", "--host")
    assert code == 0, err
    assert doc["bytes"] == 10 * MiB


def test_read_from_a_fifo_reads_until_the_writer_closes(capsys, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = fifo_writer(fifo, os.urandom(3 * MiB + 1))
    code, doc, err = cli_json(capsys, "read", fifo, "--host", "--chunk-size", "1M")
    writer.join(10)
    assert code == 0, err
    assert doc["bytes"] == 3 * MiB + 1


def test_empty_regular_files_copy_and_read(capsys, tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    code, out, err = cli(capsys, "copy", tmp_path / "empty", tmp_path / "copy", "--host")
    assert code == 0, err
    assert (tmp_path / "copy").read_bytes() == b""


def test_info_on_a_fifo_does_not_wait_for_a_writer(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "gdscp", "info", str(fifo), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(proc.stdout)["paths"]
    assert entry["kind"] == "fifo"


# -- sizes that cannot fit --------------------------------------------------------------------


def test_write_larger_than_the_disk_is_refused_up_front(capsys, tmp_path):
    code, out, err = cli(capsys, "write", tmp_path / "big", "--size", "8000P", "--host")
    assert code == 1 and "not enough space" in err and "big" in err
    assert list(tmp_path.iterdir()) == []
    # Larger than any file can be: a usage error.
    code, out, err = cli(capsys, "write", tmp_path / "big", "--size", "9999999P", "--host")
    assert code == 2 and "largest size a file can have" in err
    assert list(tmp_path.iterdir()) == []


def test_write_above_the_file_size_limit_is_refused_up_front(tmp_path):
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "from gdscp.cli.app import run\n"
        f"sys.exit(run(['write', {str(tmp_path / 'f')!r}, '--size', '2M', '--host']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "file-size limit" in proc.stderr
    assert list(tmp_path.iterdir()) == []


# -- sources that cannot be read ----------------------------------------------------------------


def _as_other_user() -> list[str]:
    """A command prefix that runs as an unprivileged user, or [] if we already are one."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a file unreadable")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_one_unreadable_source_does_not_stop_the_others(tmp_path):
    work = Path(tempfile.mkdtemp(prefix="gdscp-perm-"))
    try:
        work.chmod(0o777)
        a = random_file(work / "a", 100, seed=1)
        random_file(work / "b", 100, seed=2)
        c = random_file(work / "c", 100, seed=3)
        (work / "b").chmod(0)
        out_dir = work / "out"
        out_dir.mkdir()
        out_dir.chmod(0o777)
        for p in (work / "a", work / "c"):
            p.chmod(0o644)
        proc = subprocess.run(
            [*_as_other_user(), sys.executable, "-m", "gdscp", "copy", "a", "b", "c", "out", "--host", "--json"],
            capture_output=True, text=True, timeout=120, cwd=work,
        )
        assert proc.returncode == 1, proc.stderr
        assert "'b'" in proc.stderr or "/b'" in proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["copied"] == 2 and doc["failed"] == 1
        assert (out_dir / "a").read_bytes() == a and (out_dir / "c").read_bytes() == c
        assert not (out_dir / "b").exists()
        assert temp_files(out_dir) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_write_over_a_read_only_file_says_the_file_refuses(tmp_path):
    """FILE exists and may not be written, in a directory that takes new
    files: the error names FILE's own permission, as copy's does, rather
    than blame the directory for a temporary file it would take."""
    work = Path(tempfile.mkdtemp(prefix="gdscp-perm-"))
    try:
        work.chmod(0o777)
        (work / "f").write_bytes(b"old")
        (work / "f").chmod(0o444)
        proc = subprocess.run(
            [*_as_other_user(), sys.executable, "-m", "gdscp", "write", "f", "--size", "4K", "--host", "--json"],
            capture_output=True, text=True, timeout=120, cwd=work,
        )
        assert proc.returncode == 1, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["error"] == "cannot overwrite 'f': Permission denied", doc
        assert proc.stderr.splitlines()[-1] == f"gdscp write: error: {doc['error']}"
        assert (work / "f").read_bytes() == b"old"
        assert sorted(os.listdir(work)) == ["f"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- quiet runs and captions ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["copy", "read", "write"])
def test_quiet_prints_nothing_on_success(capsys, tmp_path, command):
    random_file(tmp_path / "a", 10 * KiB)
    args = {
        "copy": ["copy", tmp_path / "a", tmp_path / "b"],
        "read": ["read", tmp_path / "a"],
        "write": ["write", tmp_path / "w", "--size", "4K"],
    }[command]
    code, out, err = cli(capsys, *args, "-q")
    assert code == 0
    assert out == "" and err == ""


def test_failed_verify_does_not_claim_every_copy_was_compared(capsys, tmp_path):
    from gdscp import _core

    random_file(tmp_path / "a", 1000, seed=1)
    random_file(tmp_path / "b", 1000, seed=2)
    (tmp_path / "out").mkdir()
    _core.testing.arm_fault("land", 1, 1, 1)  # the second copy checked reads back a wrong byte
    try:
        code, out, err = cli(capsys, "copy", tmp_path / "a", tmp_path / "b", tmp_path / "out", "--verify", "--host")
    finally:
        _core.testing.disarm_fault()
    assert code == 1
    assert "every copy was compared" not in out
    assert "1 failed" in out
    assert "verify failed" in err and "was not changed" in err
    assert len(list((tmp_path / "out").iterdir())) == 1  # the copy that failed its check never took its name


# -- temporary files and signals --------------------------------------------------------------------


def test_a_signal_right_after_a_temporary_file_is_made_leaves_nothing_behind(tmp_path, monkeypatch):
    """Ctrl-C arriving the moment the temporary file is made is delivered on the
    way out of make_temp, before its caller learns the name: the file must
    still be found."""
    real_create = atomic.create_temporary

    def create_then_interrupt(*args, **kwargs):
        made = real_create(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # pending until make_temp lets signals through
        return made

    monkeypatch.setattr(atomic, "create_temporary", create_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic.make_temp(str(tmp_path / "dst.bin"))
    assert temp_files(tmp_path) != [], "the test did not reach the window it is about"
    atomic.remove_pending()
    assert temp_files(tmp_path) == []


def test_a_signal_as_held_signals_are_let_through_restores_every_handler(monkeypatch):
    """A signal that lands as ``signals_held`` puts the handlers back, on one
    already restored, raises there; every other handler is still put back."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    real_signal = signal.signal
    restoring = []

    def restore_then_interrupt(sig, handler):
        old = real_signal(sig, handler)
        if handler is before.get(sig) and not restoring:
            restoring.append(sig)
            raise KeyboardInterrupt  # as if the signal's own handler ran right here
        return old

    monkeypatch.setattr(atomic.signal, "signal", restore_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        with atomic.signals_held():
            pass
    monkeypatch.undo()
    assert restoring, "the test did not reach the window it is about"
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_temporary_files_go_through_a_signal_as_they_are_removed(tmp_path, monkeypatch):
    """A signal as the removal of pending temporary files begins: every file
    is still removed, then the signal's exception leaves."""
    atomic.make_temp(str(tmp_path / "a"))
    atomic.make_temp(str(tmp_path / "b"))
    real_held = atomic.signals_held
    calls = []

    def interrupted_once():
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_held()

    monkeypatch.setattr(atomic, "signals_held", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        atomic.remove_pending()
    assert temp_files(tmp_path) == [] and len(calls) == 2


def test_the_command_guard_removes_pending_temporary_files(capsys, tmp_path, monkeypatch):
    real_create = atomic.create_temporary

    def create_then_interrupt(*args, **kwargs):
        made = real_create(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return made

    monkeypatch.setattr(atomic, "create_temporary", create_then_interrupt)
    code = run(["write", str(tmp_path / "dst"), "--size", "1K", "--host"])
    assert code == 130
    assert temp_files(tmp_path) == []
    assert not (tmp_path / "dst").exists()


def test_a_signal_right_after_a_write_is_renamed_waits_for_its_name_to_be_durable(tmp_path, monkeypatch):
    """Ctrl-C the moment the new file takes FILE's name: the command ends as
    interrupted, but only once the directory is fsynced, so that FILE is the
    complete and durable new file."""
    write_command = importlib.import_module("gdscp.cli.write")
    real_commit = write_command.commit
    synced = []

    def commit_then_interrupt(tmp, dst):
        real_commit(tmp, dst)
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next line that lets it through

    monkeypatch.setattr(write_command, "commit", commit_then_interrupt)
    monkeypatch.setattr(write_command, "fsync_dir", synced.append)
    (tmp_path / "dst").write_bytes(b"old")
    code = run(["write", str(tmp_path / "dst"), "--size", "1K", "--host", "-q"])
    assert code == 130
    assert (tmp_path / "dst").read_bytes() == bytes(1024)
    assert synced == [str(tmp_path)]
    assert temp_files(tmp_path) == []


def test_an_interrupted_tree_copy_makes_the_names_it_made_durable(tmp_path, monkeypatch):
    """Ctrl-C as the files' job starts, after the directories and links are
    made: each directory holding one is still fsynced before the command ends
    as interrupted, as the job's renamed files are."""
    copy_command = importlib.import_module("gdscp.cli.copy")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "file").write_bytes(b"data")
    os.symlink("sub/file", src / "link")
    synced = []

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(copy_command, "copy_files", interrupted)
    monkeypatch.setattr(copy_command, "fsync_dir", synced.append)
    code = run(["copy", "-r", "--host", "-q", str(src), str(tmp_path / "dst")])
    assert code == 130
    assert os.readlink(tmp_path / "dst" / "link") == "sub/file"
    assert sorted(synced) == [str(tmp_path), str(tmp_path / "dst")]
    assert temp_files(tmp_path) == []


def test_test_runs_keep_only_the_folders_of_failed_tests(request):
    """Passing tests' temporary folders (some hold files of hundreds of MiB) go at
    the end of the run, so repeated runs do not fill the disk."""
    assert request.config.getini("tmp_path_retention_policy") == "failed"


# -- help texts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["copy", "read", "write", "benchmark", "info"])
def test_help_reads_like_a_unix_tool(capsys, command):
    """No Python type names or range syntax in --help: metavars only."""
    code, out, err = cli(capsys, command, "--help")
    assert code == 0
    for noise in ("<bool>", "<list", "<path>", "<int>", "{", "[x>=", "[x<="):
        assert noise not in out, f"{noise!r} in the help of {command}"


@pytest.mark.skipif(not os.path.exists("/dev/stdout"), reason="no /dev/stdout")
@pytest.mark.parametrize("command", ["copy", "write"])
def test_standard_output_as_the_destination_when_it_is_a_pipe(tmp_path, command):
    """/dev/stdout (a link, through /proc, to a pipe with no name to open) is
    written through the link, front to back, as cp and dd write it."""
    data = random_file(tmp_path / "src.bin", 300_000)
    if command == "copy":
        args = ["copy", str(tmp_path / "src.bin"), "/dev/stdout"]
        want = data
    else:
        args = ["write", "/dev/stdout", "--size", "300000", "--pattern", "seq", "--host"]
        want = memory.pattern(300_000, "seq").tobytes()
    done = subprocess.run([sys.executable, "-m", "gdscp", *args, "-q"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == want


def test_copy_from_a_fifo_and_from_standard_input(capsys, tmp_path):
    """A FIFO or a pipe named as the source (a process substitution,
    /dev/stdin) is read front to back to its end, as cp reads it; the copy
    takes its name only once complete."""
    data = random_file(tmp_path / "src.bin", 700_000)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as w:
            w.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        code, doc, err = cli_json(capsys, "copy", fifo, tmp_path / "from-fifo")
    finally:
        feeder.join(30)
    assert code == 0, err
    assert doc["copied"] == 1 and (tmp_path / "from-fifo").read_bytes() == data
    if os.path.exists("/dev/stdin"):
        done = subprocess.run([sys.executable, "-m", "gdscp", "copy", "/dev/stdin", str(tmp_path / "from-stdin"), "-q"],
                              input=data, capture_output=True, timeout=60)  # stdin a pipe
        assert done.returncode == 0, done.stderr[-2000:]
        assert (tmp_path / "from-stdin").read_bytes() == data
    assert temp_files(tmp_path) == []


def test_copy_r_of_a_fifo_named_as_src_is_refused_as_inside_a_tree(tmp_path):
    """With -r, cp makes a FIFO or device named as SRC anew rather than read
    it (--copy-contents reads it); gdscp makes no special files, and says so
    as it does for one inside a tree, rather than wait for a writer that may
    never come (or copy a whole disk for a device node). The other sources
    are still copied."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    data = random_file(tmp_path / "f.bin", 1000)
    (tmp_path / "out").mkdir()
    done = subprocess.run([sys.executable, "-m", "gdscp", "copy", "-r", "--json", str(fifo), str(tmp_path / "f.bin"),
                           str(tmp_path / "out")], capture_output=True, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["failed"] == 1 and doc["copied"] == 1
    (line,) = done.stderr.decode().splitlines()
    assert line == (f"gdscp copy: error: '{fifo}' is not a regular file, directory or symbolic link; not copied")
    assert (tmp_path / "out" / "f.bin").read_bytes() == data
    assert sorted(os.listdir(tmp_path / "out")) == ["f.bin"]
