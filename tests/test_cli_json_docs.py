"""The documents of ``gdscp copy|read|write --json`` hold exactly the keys
docs/cli-json.md lists for them, in its order: the top level and the
per-file records of each shape, and the failure document."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from gdscp.cli import copy as copy_module
from gdscp.cli.app import run
from test_mpi import _run as mpi_run
from test_mpi import needs_mpi

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli-json.md"
FAILURE = ["command", "ok", "error", "exit_code"]
MPI_ONLY = {"ranks"}


def documented(*headings: str) -> list[str]:
    """The keys of the table under the section reached through ``headings``
    (each a heading's text, below the one before), in the page's order."""
    lines = PAGE.read_text().splitlines()
    at = 0
    for heading in headings:
        at = next(i for i in range(at, len(lines)) if re.fullmatch(r"#+ " + re.escape(heading), lines[i]))
    keys = []
    for line in lines[at + 1 :]:
        if line.startswith("#"):
            break
        cell = re.match(r"\| `([a-z_]+)` \|", line)
        if cell:
            keys.append(cell.group(1))
    assert keys, headings
    return keys


def local(keys: list[str]) -> list[str]:
    """``keys`` less those only a job under MPI has."""
    return [k for k in keys if k not in MPI_ONLY]


def cli(capsys, *args: object) -> tuple[int, dict]:
    capsys.readouterr()
    code = run([os.fspath(a) for a in args] + ["--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.fixture
def sources(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("src/sub").mkdir(parents=True)
    Path("src/a").write_bytes(b"a" * 10_000)
    Path("src/sub/b").write_bytes(b"b" * 3_000)
    os.symlink("a", "src/l")
    Path("d").mkdir()
    return tmp_path


COPY = ("`copy`",)
COPY_FILE = ("`copy`", "`files[]`: one file, link or refused source")


@pytest.mark.parametrize("args, code, statuses", [
    (["src/a", "d/a"], 0, ["copied"]),
    (["src/a", "src/sub/b", "d"], 0, ["copied", "copied"]),
    (["src/a", "src/missing", "d"], 1, ["failed", "copied"]),
    (["-r", "src", "d/tree"], 0, ["copied", "copied", "copied"]),
    (["-n", "src/a", "src/a"], 0, ["skipped"]),
])
def test_copy_documents_hold_the_documented_keys(capsys, sources, args, code, statuses):
    got, doc = cli(capsys, "copy", *args)
    assert got == code
    assert list(doc) == local(documented(*COPY))
    assert [r["status"] for r in doc["files"]] == statuses
    for record in doc["files"]:
        assert list(record) == local(documented(*COPY_FILE)), record
        assert (record["error"] is None) == (record["status"] in ("copied", "skipped")), record
    assert doc["bytes"] == sum(r["bytes"] for r in doc["files"])
    assert (doc["device"], doc["devices"], doc["device_bytes"], doc["memory"]) == (None, None, None, "host")


def test_a_copy_interrupted_part_way_is_the_failure_document_and_the_copys(capsys, sources, monkeypatch):
    def interrupted(src, writer, buffer, progress, verify):
        raise KeyboardInterrupt

    monkeypatch.setattr(copy_module, "copy_through", interrupted)
    r, w = os.pipe()
    try:
        code, doc = cli(capsys, "copy", "src/a", f"/dev/fd/{w}")
    finally:
        os.close(r)
        os.close(w)
    assert code == 130
    copy_keys = local(documented(*COPY))
    assert list(doc) == FAILURE + copy_keys[copy_keys.index("memory"):]
    assert [(r["status"], r["error"]) for r in doc["files"]] == [("cancelled", "not copied: interrupted")]
    assert list(doc["files"][0]) == local(documented(*COPY_FILE))


@pytest.mark.parametrize("command", [
    ["copy", "--bogus"],
    ["copy", "src/a", "src/sub/b", "src/a"],
    ["read", "src/missing"],
    ["write", "d/", "--size", "1K"],
])
def test_the_failure_document_holds_its_four_keys(capsys, sources, command):
    code, doc = cli(capsys, *command)
    assert list(doc) == FAILURE == documented("The failure document")
    assert doc["ok"] is False and doc["exit_code"] == code and code in (1, 2)
    assert doc["command"] == command[0] and "\n" not in doc["error"]


READ = ("`read`",)
READ_FILE = ("`read`", "`files[]`: one FILE")


@pytest.mark.parametrize("files, code, statuses", [
    (["src/a"], 0, ["done"]),
    (["src/a", "src/sub/b"], 0, ["done", "done"]),
    (["src/a", "src/missing"], 1, ["done", "failed"]),
])
def test_read_documents_hold_the_documented_keys(capsys, sources, files, code, statuses):
    got, doc = cli(capsys, "read", "--host", *files)
    assert got == code
    assert list(doc) == local(documented(*READ))
    assert [r["status"] for r in doc["files"]] == statuses
    for record in doc["files"]:
        assert list(record) == documented(*READ_FILE), record
        assert (record["error"] is None) == (record["status"] == "done"), record
    assert [r["path"] for r in doc["files"]] == files
    assert doc["bytes"] == sum(r["bytes"] for r in doc["files"])


WRITE_ONE = ("`write`", "One file")
WRITE_MANY = ("`write`", "Several files")
WRITE_FILE = ("`write`", "Several files", "`files[]`: one FILE")


def test_write_of_one_file_holds_the_documented_keys(capsys, sources):
    code, doc = cli(capsys, "write", "--host", "d/w", "--size", "4K")
    assert code == 0
    assert list(doc) == documented(*WRITE_ONE)
    assert (doc["path"], doc["bytes"], doc["devices"]) == ("d/w", 4096, None)


def test_write_of_several_files_holds_the_documented_keys(capsys, sources):
    code, doc = cli(capsys, "write", "--host", "d/w1", "nowhere/w2", "--size", "4K")
    assert code == 1
    assert list(doc) == documented(*WRITE_MANY)
    assert doc["paths"] == ["d/w1", "nowhere/w2"]
    assert [r["status"] for r in doc["files"]] == ["done", "failed"]
    for record in doc["files"]:
        assert list(record) == documented(*WRITE_FILE), record
    assert [r["backend"] for r in doc["files"]] == ["posix", None]
    assert doc["files"][1]["error"] is not None and doc["files"][0]["error"] is None


@needs_mpi
def test_documents_under_mpi_add_the_documented_keys(tmp_path):
    """On two ranks: ``ranks`` ends the top level of copy and read (read's
    before ``setup_seconds``), a file shared among the ranks lists them in
    its record, and write's one document is the one the page spells out."""
    (tmp_path / "big").write_bytes(os.urandom(8 << 20))
    (tmp_path / "small").write_bytes(b"s" * 1_000)
    (tmp_path / "d").mkdir()
    done = mpi_run(["copy", "--json", "-q", "--chunk-size", "1M", str(tmp_path / "big"), str(tmp_path / "small"),
                    str(tmp_path / "d")], ranks=2)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert list(doc) == documented(*COPY)
    shared, alone = doc["files"]
    assert list(shared) == documented(*COPY_FILE) and shared["ranks"] == [0, 1]
    assert list(alone) == local(documented(*COPY_FILE))
    assert doc["ranks"] == 2

    done = mpi_run(["read", "--json", "-q", "--host", str(tmp_path / "big"), str(tmp_path / "small")], ranks=2)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert list(doc) == documented(*READ) and doc["ranks"] == 2
    assert [list(r) for r in doc["files"]] == [documented(*READ_FILE)] * 2

    done = mpi_run(["write", "--json", "-q", "--host", str(tmp_path / "w"), "--size", "1M"], ranks=2)
    assert done.returncode == 0, done.stderr
    page = PAGE.read_text()
    spelled = re.search(r"has neither `devices` nor `backend_reason`.*?ends with `ranks`:\n(.*?)\.\n", page, re.S)
    assert list(json.loads(done.stdout)) == re.findall(r"`([a-z_]+)`", spelled.group(1))
