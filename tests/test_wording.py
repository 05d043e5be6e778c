"""The repository speaks only of the software: scripts/check_wording.py finds no
development narration in any tracked file or file name.

The check needs the git checkout (it scans what git tracks), so it is skipped
where the tests run from a copy without one. The checker's own behaviour is
tested on a scratch repository; its sample lines are assembled from pieces so
that this file holds none of the phrases it looks for.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CHECKER = ROOT / "scripts" / "check_wording.py"


def _checkout_root() -> tuple[Path | None, str]:
    """The git checkout that holds this tests directory at its top, or None and why not."""
    if not CHECKER.is_file():
        return None, f"{CHECKER} is missing"
    if shutil.which("git") is None:
        return None, "git is not installed"
    done = subprocess.run(
        ["git", "-C", str(TESTS), "rev-parse", "--show-toplevel"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return None, f"{TESTS} is not in a git checkout ({done.stderr.strip()})"
    top = Path(done.stdout.strip()).resolve()
    if top != ROOT:
        return None, f"{TESTS} is not at the top of the git checkout {top}"
    return top, ""


def _run(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECKER), str(repo)], capture_output=True, text=True, timeout=120
    )


def test_repository_has_no_development_narration():
    root, why = _checkout_root()
    if root is None:
        pytest.skip(f"the wording check scans a git checkout: {why}")
    done = _run(root)
    assert done.returncode == 0, (
        "development narration in the repository (describe the software instead):\n"
        + done.stdout
        + done.stderr
    )


def _j(*parts: str) -> str:
    return "".join(parts)


NARRATION = [
    _j("Figures of the fifth ses", "sion."),
    _j("See is", "sue 4 for the figures."),
    _j("Finished in ta", "sk 3."),
    _j("Requ", "irement 2 is met."),
    _j("Measured on the le", "nt machine."),
    _j("Run on the bor", "rowed H200."),
    _j("168 s of dev", "ice time were left."),
    _j("Notes in /wo", "rk/notes.md."),
    _j("As shared/ref", "erence/h200.md says."),
    _j("Reverted; com", "mit 1a2b3c4 is to re-ap", "ply later."),
    _j("Kept on branch ex", "p/claim-policy."),
    _j("A second ro", "und of work followed."),
]

LEGITIMATE = [
    '@pytest.fixture(scope="session")',
    "def pytest_sessionstart(session): session.config.cache = None",
    "A worker claims a task 4M chunk; tasks 4 / 16 / 64 MiB were swept.",
    "The workers issue 2 reads at once, 16 threads in all.",
    "With no current context, borrow GPU 0's primary one.",
    "A task is the unit of work a thread pool hands out.",
    "The copy is timed with CUDA events on the GPU.",
    "Requirements: Python 3.10 or newer.",
]


@pytest.fixture
def scratch_repo(tmp_path):
    if shutil.which("git") is None or not CHECKER.is_file():
        pytest.skip("needs git and scripts/check_wording.py")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)

    def make(files: dict[str, str]) -> Path:
        for name, text in files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
        subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
        return tmp_path

    return make


def test_checker_reports_each_narration_line(scratch_repo):
    repo = scratch_repo({"notes.md": "\n".join(["A clean first line."] + NARRATION) + "\n"})
    done = _run(repo)
    assert done.returncode == 1, done.stdout + done.stderr
    reported = {line.split(":")[1] for line in done.stdout.splitlines()}
    assert reported == {str(n) for n in range(2, len(NARRATION) + 2)}, done.stdout


def test_checker_reports_a_narrating_file_name(scratch_repo):
    repo = scratch_repo({_j("data/h200-s", "5-0900-gpu.json"): "{}\n"})
    done = _run(repo)
    assert done.returncode == 1
    assert done.stdout.startswith(_j("data/h200-s", "5-0900-gpu.json:0:")), done.stdout


def test_checker_passes_legitimate_text_and_binary_files(scratch_repo):
    repo = scratch_repo({
        "ok.py": "\n".join(LEGITIMATE) + "\n",
        "blob.bin": "\0" + NARRATION[0],
    })
    done = _run(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""
