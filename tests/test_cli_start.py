"""The start of the ``gdscp`` command: a Ctrl-C while Python loads the command
line, bad ``GDSCP_*`` environment variables, and an import or a worker pool
that fails for want of memory or threads, end in one line and an exit code,
never a traceback.

Each case runs the console script's entry (``gdscp.cli.main:main``) in a
child process. An import hook in the child marks the moment: it sends the
SIGINT (or raises KeyboardInterrupt) while a chosen module is being imported,
or starts a timer when the entry begins loading the command line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

# The child: argv[1] is the case, argv[2] the module whose import triggers it,
# argv[3] the timer's delay, the rest the command line it runs through the entry.
CHILD = r"""
import os, signal, sys, threading
case, module, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])

class Hook:
    fired = False
    sent = False

    def find_spec(self, name, path=None, target=None):
        if name == module and not Hook.fired:
            Hook.fired = True
            if case == "signal":
                os.kill(os.getpid(), signal.SIGINT)  # handled before the import goes on
            elif case in ("SIGTERM", "SIGHUP"):
                os.kill(os.getpid(), getattr(signal, case))
            elif case == "raise":
                raise KeyboardInterrupt
            elif case == "engine":
                # The engine's extension module makes its enums through
                # Python's enum module as it loads: the SIGINT comes then.
                import enum
                make = enum.EnumType._create_

                def create(cls, *args, **kwargs):
                    if not Hook.sent:
                        Hook.sent = True
                        os.kill(os.getpid(), signal.SIGINT)
                    return make(cls, *args, **kwargs)

                enum.EnumType._create_ = create
            elif case == "ImportError":
                # As numpy's: a page of advice around the loader's reason
                # (an address-space limit leaves no room to map a library).
                cause = ImportError("libquadmath.so.0: failed to map segment from shared object")
                raise ImportError("\n\nIMPORTANT: PLEASE READ THIS\n\nmuch advice\n") from cause
            elif case == "MemoryError":
                raise MemoryError
            elif case == "blas":
                sys.stderr.write(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}\n")
            elif case == "timer":
                # A daemon: a command that finishes first exits without waiting for it.
                timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
                timer.daemon = True
                timer.start()
        return None

sys.meta_path.insert(0, Hook())
sys.argv = ["gdscp", *sys.argv[4:]]
from gdscp.cli.main import main
main()
"""


def _child(
    case: str, module: str, delay: float = 0.0, env: dict | None = None, args: tuple = ("info",)
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", CHILD, case, module, str(delay), *args],
        env=full_env, capture_output=True, text=True, timeout=120,
    )


def _interrupted_quietly(result: subprocess.CompletedProcess) -> None:
    """Exit 130 with at most one line: the entry's "gdscp: interrupted" while the
    command line loads, or the command's own "gdscp CMD: error: interrupted" once
    it runs."""
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    text = result.stderr.strip()
    assert text == "" or re.fullmatch(r"gdscp( [a-z]+)?: (error: )?interrupted", text), result.stderr


# Modules a command loads after its entry has started, in the order it loads
# them: `gdscp info` most of the command line and the engine; `gdscp benchmark`
# numpy and the benchmark too.
@pytest.mark.parametrize(
    "args, module",
    [(("info",), m) for m in ("gdscp.mpi.launch", "gdscp.cli.app", "typer", "rich.console", "gdscp.cufile",
                              "gdscp._core")]
    + [(("benchmark", "--help"), m) for m in ("gdscp.cli.benchmark", "numpy")],
)
def test_ctrl_c_while_the_command_line_loads(args, module):
    result = _child("signal", module, args=args)
    assert f"no module {module}" not in result.stderr
    _interrupted_quietly(result)
    assert result.stdout == ""


@pytest.mark.parametrize("args, module", [(("info",), "gdscp.cli.app"), (("info",), "typer"),
                                          (("benchmark", "--help"), "numpy")])
def test_keyboard_interrupt_raised_by_an_import(args, module):
    _interrupted_quietly(_child("raise", module, args=args))


@pytest.mark.parametrize("args", [("copy", "a", "b"), ("read", "a"), ("write", "a", "--size", "1K"), ("info",)],
                         ids=lambda a: a[0])
def test_ctrl_c_while_the_engine_loads(args):
    """A Ctrl-C while the engine's extension module loads (inside its own
    calls into Python) ends the command as interrupted, not with the
    extension's fatal error and a core dump."""
    result = _child("engine", "gdscp._core", args=args)
    assert "nanobind" not in result.stderr, result.stderr
    _interrupted_quietly(result)


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03, 0.1, 0.2, 0.4])
def test_ctrl_c_at_delays_after_the_entry_starts(delay):
    """Wherever the SIGINT lands (in an import, or in the command once it
    runs), the command ends quietly; late enough, `info` may finish first."""
    result = _child("timer", "gdscp.cli.app", delay)
    if delay == 0.0 or result.returncode != 0:
        _interrupted_quietly(result)
    else:
        assert "Traceback" not in result.stderr


def _run_ignoring_while_loading(sig: str, argv: list[str]) -> subprocess.CompletedProcess:
    """Runs the command line with ``sig`` ignored, sending itself one as it
    imports Typer (while the command line loads)."""
    code = (
        "import os, signal, sys\n"
        f"signal.signal(signal.{sig}, signal.SIG_IGN)\n"
        "class Hook:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'typer':\n"
        f"            os.kill(os.getpid(), signal.{sig})\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hook())\n"
        f"sys.argv = {argv!r}\n"
        "from gdscp.cli.main import main\n"
        "main()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_an_ignored_sigint_stays_ignored():
    """Started with SIGINT ignored (a background job), the command is not ended by one."""
    result = _run_ignoring_while_loading("SIGINT", ["gdscp", "--version"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gdscp ")


BAD_VARIABLES = [
    ("GDSCP_TASK_SIZE", "big", "positive size such as"),
    ("GDSCP_NUM_THREADS", "0", "from 1 to 4096"),
    ("GDSCP_COMPAT_MODE", "sometimes", "ON, OFF or AUTO"),
    ("GDSCP_DIRECT_IO", "sideways", "on, off or auto"),
    ("GDSCP_MPI", "maybe", "1 or 0"),
    ("GDSCP_MPI_ABORT_AFTER", "nan", "seconds from 0 to 86400"),
]


def _gdscp_with(variables: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    env.update(variables)
    return subprocess.run([sys.executable, "-m", "gdscp", *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("variable, value, accepted", BAD_VARIABLES)
@pytest.mark.parametrize("args", [["info"], ["copy", "in", "out"]])
def test_bad_environment_variable_is_one_line_exit_2(tmp_path, variable, value, accepted, args):
    (tmp_path / "in").write_bytes(b"data")
    result = _gdscp_with({variable: value}, *[str(tmp_path / a) if a in ("in", "out") else a for a in args])
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gdscp: error: {variable}={value!r}")
    assert accepted in lines[0]
    assert result.stdout == ""
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["abc", "0", "100000"])
@pytest.mark.parametrize("args", [["copy", "in", "out"], ["write", "out", "--size", "4K"], ["read", "in", "--host"]])
def test_a_bad_thread_count_variable_stops_a_command_given_threads(tmp_path, value, args):
    """--threads comes before GDSCP_NUM_THREADS, and a bad GDSCP_NUM_THREADS
    is still the mistake it is without --threads (as a bad GDSCP_TASK_SIZE is
    beside --task-size): one line naming it, exit 2, nothing written."""
    (tmp_path / "in").write_bytes(b"data")
    argv = [str(tmp_path / a) if a in ("in", "out") else a for a in args]
    result = _gdscp_with({"GDSCP_NUM_THREADS": value}, *argv, "--threads", "2")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"gdscp: error: GDSCP_NUM_THREADS={value!r} is not valid: "
        + (f"{value!r} is not a whole number; " if value == "abc" else "")
        + "GDSCP_NUM_THREADS takes an integer from 1 to 4096"], result.stderr
    assert result.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("variable, value, accepted", BAD_VARIABLES)
@pytest.mark.parametrize("args", [["--help"], ["copy", "--help"], ["read", "-h"]])
def test_help_is_printed_despite_a_bad_environment_variable(variable, value, accepted, args):
    """The help uses no setting: printed on stdout, exit 0, the variable
    named in a warning line on stderr (a command that runs refuses it)."""
    result = _gdscp_with({variable: value}, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout == _gdscp_with({}, *args).stdout
    assert "Usage: gdscp" in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    where = "gdscp" if args[0].startswith("-") else f"gdscp {args[0]}"
    assert lines[0].startswith(f"{where}: warning: {variable}={value!r} is not valid")
    assert accepted in lines[0]


def test_the_options_that_take_a_value_are_the_commands_own():
    """The entry point tells an option's value from an option without
    loading the commands (``exits.TAKING_VALUES``): its table must be the
    commands' own."""
    import click
    import typer

    from gdscp.cli import app
    from gdscp.cli.exits import COMMANDS, TAKING_VALUES

    app.load([])
    root = typer.main.get_command(app.app)
    context = click.Context(root)
    assert sorted(TAKING_VALUES) == sorted(COMMANDS)
    for name in COMMANDS:
        params = root.get_command(context, name).params
        taking = {opt for p in params if isinstance(p, click.Option) and not p.is_flag and not p.count
                  for opt in p.opts + p.secondary_opts}
        assert set(TAKING_VALUES[name]) == taking, name
    assert not any(isinstance(p, click.Option) and not p.is_flag for p in root.params)


@pytest.mark.parametrize("args, help_asked", [
    (["read", "-h"], True),
    (["--help"], True),
    (["copy", "-rh"], True),  # short flags run together, as Click reads them
    (["write", "-qh", "f"], True),
    (["write", "-hs", "1K", "f"], True),
    (["benchmark", "--dir", "-h"], False),  # the value of --dir
    (["benchmark", "--dir", "--help", "--json"], False),
    (["benchmark", "--dir=-h"], False),
    (["write", "-s", "-h", "f"], False),
    (["write", "-s-h", "f"], False),
    (["copy", "a", "--", "-h"], False),  # after "--", a file's name
    (["--", "read", "-h"], True),  # "--" before the command ends only gdscp's own options
    (["--", "read", "f", "--json"], False),
    (["--", "read", "--", "-h"], False),
])
def test_help_is_asked_for_as_click_reads_the_line(args, help_asked):
    from gdscp.cli.exits import asks_for_help, json_asked

    assert asks_for_help(args) is help_asked
    assert json_asked(args) is (args[-1] == "--json" and "--" not in args[1:])
    assert not json_asked(["benchmark", "--dir", "--json"])  # a directory named "--json"


def test_an_option_value_that_looks_like_help_still_stops_at_a_bad_variable(tmp_path):
    """``--dir -h`` runs the benchmark in a directory named "-h": a command
    that runs, so a bad variable stops it, exit 2, nothing written. Help
    asked for among short flags run together (``-rh``) is help, printed
    despite the variable."""
    (tmp_path / "-h").mkdir()
    args = ["benchmark", "--dir", "-h", "--size", "64K", "--runs", "1", "--threads", "1", "--host", "--json"]
    bad = {"GDSCP_NUM_THREADS": "abc"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")} | bad
    done = subprocess.run([sys.executable, "-m", "gdscp", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [done.stderr.splitlines()[0]], done.stderr
    assert done.stderr.startswith("gdscp: error: GDSCP_NUM_THREADS='abc' is not valid"), done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2
    assert os.listdir(tmp_path / "-h") == []
    helped = _gdscp_with(bad, "copy", "-rh")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout == _gdscp_with({}, "copy", "--help").stdout
    assert helped.stderr.startswith("gdscp copy: warning: GDSCP_NUM_THREADS='abc' is not valid"), helped.stderr


def test_shell_completion_despite_a_bad_environment_variable():
    """The shell's completion uses no setting either: its answer comes, with
    no warning (it would print under the prompt at every Tab); the
    completion script is shown, the variable named in a warning."""
    bad = {"GDSCP_NUM_THREADS": "abc"}
    asked = {"_GDSCP_COMPLETE": "complete_bash", "COMP_WORDS": "gdscp re", "COMP_CWORD": "1"}
    answer = _gdscp_with(bad | asked)
    assert (answer.returncode, answer.stdout.split(), answer.stderr) == (0, ["read"], "")
    shown = _gdscp_with(bad, "--show-completion", "bash")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == _gdscp_with({}, "--show-completion", "bash").stdout
    assert "_gdscp_completion" in shown.stdout
    assert shown.stderr.startswith("gdscp: warning: GDSCP_NUM_THREADS='abc' is not valid"), shown.stderr


@pytest.mark.parametrize("instruction", ["bash_complete", "zsh_complete", "x"])
def test_a_completion_instruction_not_understood_is_said_as_such(instruction):
    """An instruction the completion does not know (Click's newer
    ``bash_complete``) is said by the completion itself, exit 1, and is
    not taken for help that could not be written."""
    done = _gdscp_with({"_GDSCP_COMPLETE": instruction, "COMP_WORDS": "gdscp re", "COMP_CWORD": "1"})
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    said = "Invalid completion instruction" if instruction == "x" else "Shell complete not supported"
    assert said in done.stderr and "cannot write the help" not in done.stderr, done.stderr


@pytest.mark.parametrize("args, code", [(["--version"], 0), (["-V"], 0), ([], 2)])
def test_version_and_bare_help_despite_bad_environment_variables(args, code):
    """The version, and the help a bare ``gdscp`` shows (exit 2, as always),
    likewise; two bad variables are two warnings. ``--quiet`` silences them."""
    bad = {"GDSCP_NUM_THREADS": "abc", "GDSCP_COMPAT_MODE": "bogus"}
    result = _gdscp_with(bad, *args)
    assert result.returncode == code, result.stderr
    assert result.stdout == _gdscp_with({}, *args).stdout
    assert ("Usage: gdscp" in result.stdout) if not args else result.stdout.startswith("gdscp ")
    lines = sorted(result.stderr.splitlines())
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("gdscp: warning: GDSCP_COMPAT_MODE='bogus' is not valid")
    assert lines[1].startswith("gdscp: warning: GDSCP_NUM_THREADS='abc' is not valid")
    quiet = _gdscp_with(bad, "copy", "--help", "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert "Usage: gdscp copy" in quiet.stdout
    assert quiet.stderr == ""


def test_size_variables_with_suffixes_reach_the_command():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    env.update(GDSCP_TASK_SIZE="4M", GDSCP_BOUNCE_BUFFER_SIZE="1MiB")
    result = subprocess.run([sys.executable, "-m", "gdscp", "info", "--json"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert '"task_size": 4194304' in result.stdout
    assert '"bounce_buffer_size": 1048576' in result.stdout


def test_copy_loads_neither_numpy_nor_cupy(tmp_path):
    """`gdscp copy` makes no host arrays and its staging is the engine's own, so
    a new process copying a tree never pays for importing numpy (a quarter of a
    second on some machines) or CuPy; through a GPU where there is one, else
    host memory. The copies are byte-exact."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    data = {"a.bin": os.urandom(70_001), "sub/b.bin": os.urandom(1), "sub/empty": b""}
    for name, content in data.items():
        (src / name).write_bytes(content)
    program = (
        "import sys\nfrom gdscp.cli.app import run\n"
        f"code = run(['copy', '-r', '-q', {str(src)!r}, {str(tmp_path / 'out')!r}])\n"
        "print(code, 'numpy' in sys.modules, 'cupy' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["0", "False", "False"], done.stderr
    for name, content in data.items():
        assert (tmp_path / "out" / name).read_bytes() == content


@pytest.mark.parametrize(
    "argv, loads",
    [
        (["gdscp", "copy", "a", "b"], False),
        (["gdscp", "copy", "--device", "0", "a", "b"], True),
        (["gdscp", "copy", "--devices=all", "a", "b"], True),
        (["gdscp", "read", "a"], True),
        (["gdscp", "read", "--device", "0", "a"], True),
        (["gdscp", "write", "f", "--size", "1M"], True),
        (["gdscp", "copy", "--host", "a", "b"], False),
        (["gdscp", "read", "--help"], False),
        (["gdscp", "write", "-h"], False),
        (["gdscp", "info"], False),
        (["gdscp", "benchmark"], False),
        (["gdscp"], False),
    ],
)
@pytest.mark.usefixtures("no_mpi_launcher")
def test_the_driver_loads_beside_the_command_line_only_for_gpu_commands(argv, loads):
    """read and write without --host, and copy with a GPU named, load the
    NVIDIA driver (and make the GPU's context) on a thread while the command
    line loads; on a
    machine without a driver the thread ends quietly (the command reports
    what is missing)."""
    from gdscp.cli import main

    thread = main._load_gpu_driver(argv)
    assert (thread is not None) == loads
    if thread is not None:
        thread.join(60)
        assert not thread.is_alive()


@pytest.fixture
def no_mpi_launcher(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("OMPI_", "PMIX_", "PMI_", "MV2_", "PALS_", "SLURM_")):
            monkeypatch.delenv(name)


def test_no_early_driver_for_a_rank_of_an_mpi_job(monkeypatch):
    """Its MPI library starts meanwhile and may use the GPU itself."""
    from gdscp.cli import main

    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert main._load_gpu_driver(["gdscp", "copy", "--device", "0", "a", "b"]) is None
    assert main._load_gpu_driver(["gdscp", "read", "a"]) is None


def test_the_gpu_named_for_the_early_context():
    from gdscp.cli.main import _named_device

    assert _named_device(["read", "a", "b"]) is None
    assert _named_device(["read", "--device", "1", "a"]) == 1
    assert _named_device(["copy", "a", "--device=2"]) == 2
    assert _named_device(["read", "--devices", "0,1", "a"]) is False
    assert _named_device(["write", "--devices=all"]) is False
    assert _named_device(["read", "--device", "x"]) is False
    assert _named_device(["read", "--device"]) is False
    # "--device" as the value of an option, or after "--", names no GPU:
    assert _named_device(["write", "--pattern", "--device", "7", "a"]) is None
    assert _named_device(["read", "--", "--device", "3"]) is None
    assert _named_device(["--", "read", "--device", "3"]) == 3
    # digits int() does not read (superscripts) name no GPU; Click refuses them
    assert _named_device(["read", "--device", "\u00b2", "a"]) is False
    assert _named_device(["read", "--device", "\u0663", "a"]) == 3  # Arabic-Indic 3, as int() reads it


@pytest.mark.parametrize("argv", [["read", "--device", "\u00b2", "f"], ["write", "--json", "--device=\u00b3", "f"],
                                  ["copy", "--device", "\u00b2", "a", "b"]])
def test_a_device_number_int_cannot_read_is_a_usage_error(tmp_path, argv):
    """``--device ²`` (a digit to str.isdigit, not to int()) is refused as
    Click refuses any other bad number: exit 2, one line, with --json a
    document; nothing written."""
    (tmp_path / "a").write_bytes(b"abc")
    done = subprocess.run([sys.executable, "-m", "gdscp", *argv], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "--device" in done.stderr, done.stderr
    if "--json" in argv:
        doc = json.loads(done.stdout)
        assert doc["ok"] is False and doc["exit_code"] == 2
    assert sorted(os.listdir(tmp_path)) == ["a"]


@pytest.mark.parametrize("bad", [{}, {"GDSCP_TASK_SIZE": "zz"}])
def test_dashes_before_the_command_change_nothing(tmp_path, bad):
    """``gdscp -- read ...`` is ``gdscp read ...`` to Click: its --json gives
    the document, its --help the help (despite a bad variable, as without
    the dashes)."""
    (tmp_path / "f").write_bytes(b"x" * 10)
    plain = _gdscp_with(bad, "read", "--json", "--offset", "zz", str(tmp_path / "f"))
    dashed = _gdscp_with(bad, "--", "read", "--json", "--offset", "zz", str(tmp_path / "f"))
    assert dashed.returncode == plain.returncode == 2, dashed.stderr
    assert json.loads(dashed.stdout) == json.loads(plain.stdout)
    assert dashed.stderr == plain.stderr
    helped = _gdscp_with(bad, "--", "read", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout == _gdscp_with({}, "read", "--help").stdout


# The end of a command: _leave(code) with a thread still running, an atexit
# function, unflushed output, and an object whose finalizer only the
# interpreter's teardown runs. argv[1]: "plain", or "mpi" (mpi4py's MPI module
# loaded, which finalizes MPI in that teardown).
LEAVING = r"""
import atexit, sys, threading, time, types

class Torn:
    def __del__(self):
        sys.stdout.write("torn down\n")
        sys.stdout.flush()

kept = Torn()
if sys.argv[1] == "mpi":
    sys.modules["mpi4py.MPI"] = types.ModuleType("mpi4py.MPI")
atexit.register(lambda: sys.stdout.write("atexit ran\n"))
worker = threading.Thread(target=lambda: (time.sleep(0.3), sys.stdout.write("thread done\n")))
worker.start()
sys.stdout.write("unflushed")
from gdscp.cli.main import _leave
_leave(3)
"""


@pytest.mark.parametrize("case", ["plain", "mpi"])
def test_leaving_waits_for_threads_atexit_and_output(case):
    """The command's end skips the interpreter's teardown, but not what an
    exit must do: other threads finish, atexit functions run, buffered output
    is written, the exit code is kept. Under MPI the interpreter's own exit
    runs (it finalizes MPI), teardown included."""
    done = subprocess.run([sys.executable, "-c", LEAVING, case], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    expected = "unflushedthread done\natexit ran\n"
    if case == "mpi":
        expected += "torn down\n"
    assert done.stdout == expected
    assert done.stderr == ""


def _interrupted_document(result: subprocess.CompletedProcess, command: str) -> None:
    """Exit 130, and on stdout the failure document --json promises."""
    import json

    _interrupted_quietly(result)
    assert json.loads(result.stdout) == {"command": command, "ok": False, "error": "interrupted", "exit_code": 130}


_JSON_COMMANDS = [("copy", "a", "b", "--json"), ("read", "a", "--json"), ("write", "a", "--size", "1K", "--json"),
                  ("benchmark", "--json"), ("info", "--json")]


@pytest.mark.parametrize("args", _JSON_COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("module", ["gdscp.mpi.launch", "gdscp.cli.app", "typer"])
def test_ctrl_c_while_loading_gives_the_json_document(args, module):
    """Every command with --json: a Ctrl-C while the command line loads still
    gives the failure document, as one during the command does."""
    _interrupted_document(_child("signal", module, args=args), args[0])


@pytest.mark.parametrize("args", _JSON_COMMANDS, ids=lambda a: a[0])
def test_keyboard_interrupt_raised_by_an_import_gives_the_json_document(args):
    _interrupted_document(_child("raise", "gdscp.cli.app", args=args), args[0])


@pytest.mark.parametrize("args", _JSON_COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("sig, code, word", [("SIGTERM", 143, "terminated"), ("SIGHUP", 129, "hung up")])
def test_sigterm_or_sighup_while_loading_ends_as_during_the_command(args, sig, code, word):
    """SIGTERM (a timeout, a scheduler) or SIGHUP while the command line
    loads ends it as one during the command does: one line, 143 (129), and
    with --json the failure document, which a script reading stdout expects;
    not a process killed with nothing said."""
    import json

    for module in ("gdscp.mpi.launch", "gdscp.cli.app", "typer"):
        result = _child(sig, module, args=args)
        assert result.returncode == code, (module, result.returncode, result.stderr)
        assert result.stderr == f"gdscp: {word}\n", (module, result.stderr)
        assert json.loads(result.stdout) == {"command": args[0], "ok": False, "error": word, "exit_code": code}


def test_an_ignored_sigterm_stays_ignored_while_loading():
    """Started with SIGTERM ignored, one while the command line loads does not end it."""
    result = _run_ignoring_while_loading("SIGTERM", ["gdscp", "info", "--json"])
    assert result.returncode == 0, result.stderr
    assert '"ok": true' in result.stdout


def test_ctrl_c_as_the_command_ends_is_quiet():
    """A Ctrl-C landing after the command has returned, before the handlers
    that end the process quietly are in place: no traceback, exit 130, and
    stdout holds the command's one document."""
    import json

    code = (
        "import os, signal, sys\n"
        "import gdscp.cli.main as entry\n"
        "real = entry._signals_end_quietly\n"
        "def late():\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # handled before the next line runs\n"
        "    real()\n"
        "entry._signals_end_quietly = late\n"
        "sys.argv = ['gdscp', 'info', '--json']\n"
        "entry.main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and result.stderr == "", result.stderr
    assert json.loads(result.stdout)["command"] == "info"


# The child: argv[1] is when the signal comes (as the result is being
# serialised, or halfway through writing it), argv[2] the signal, the rest
# the command line run through the entry.
RESULT_SIGNALLED = r"""
import os, signal, sys
from gdscp.cli import output
when, sig = sys.argv[1], getattr(signal, sys.argv[2])
sent = []
if when == "serialising":
    serialise = output.json_text
    def json_text(data):
        if not sent:
            sent.append(os.kill(os.getpid(), sig))
        return serialise(data)
    output.json_text = json_text
else:
    write = output._write_stdout
    def _write_stdout(text):
        half = len(text) // 2
        write(text[:half])
        if not sent:
            sent.append(os.kill(os.getpid(), sig))
        write(text[half:])
    output._write_stdout = _write_stdout
sys.argv = ["gdscp", *sys.argv[3:]]
from gdscp.cli.main import main
main()
"""


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
@pytest.mark.parametrize("when", ["serialising", "writing"])
def test_a_signal_as_the_result_is_written_leaves_one_whole_document(tmp_path, when, sig, code):
    """A Ctrl-C or SIGTERM as the command's --json result is being made or
    written: stdout still holds one whole JSON document, the failure's where
    the signal came before the result began (listing the file, copied by
    then), else the result itself; the exit code is the signal's."""
    import json

    (tmp_path / "a").write_bytes(b"12345")
    done = subprocess.run([sys.executable, "-c", RESULT_SIGNALLED, when, sig, "copy", str(tmp_path / "a"),
                           str(tmp_path / "b"), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    doc = json.loads(done.stdout)
    if when == "serialising":
        word = "interrupted" if sig == "SIGINT" else "terminated"
        assert {k: doc[k] for k in ("command", "ok", "error", "exit_code", "copied", "failed", "bytes")} == {
            "command": "copy", "ok": False, "error": word, "exit_code": code, "copied": 1, "failed": 0, "bytes": 5}
        assert [(f["source"], f["status"], f["bytes"]) for f in doc["files"]] == [(str(tmp_path / "a"), "copied", 5)]
    else:
        assert doc["ok"] is True and doc["copied"] == 1


@pytest.mark.parametrize("case, said", [
    ("ImportError", "ImportError: libquadmath.so.0: failed to map segment from shared object"),
    ("MemoryError", "out of memory"),
])
@pytest.mark.parametrize("json_asked", [False, True])
def test_an_import_that_fails_while_loading_is_one_line(tmp_path, case, said, json_asked):
    """An import of the command line that fails (numpy under an address-space
    limit, memory short): one line saying the deepest cause, exit 1, with
    --json the failure document; never a traceback."""
    import json

    args = ("write", str(tmp_path / "o"), "--size", "1K", *(["--json"] if json_asked else []))
    result = _child(case, "numpy", args=args)
    assert result.returncode == 1, result.stderr
    assert result.stderr == f"gdscp write: error: cannot start: {said}\n"
    if json_asked:
        assert json.loads(result.stdout) == {"command": "write", "ok": False, "error": f"cannot start: {said}",
                                             "exit_code": 1}
    else:
        assert result.stdout == ""
    assert not (tmp_path / "o").exists()


def test_a_failure_while_loading_shows_its_traceback_with_debug(tmp_path):
    result = _child("MemoryError", "numpy", args=("write", str(tmp_path / "o"), "--size", "1K", "--debug"))
    assert result.returncode == 1
    assert "Traceback" in result.stderr and result.stderr.endswith("gdscp write: error: cannot start: out of memory\n")


# The command line run with the engine's pool refused every worker from index
# argv[1] on, as by a system out of threads (a pids limit, ulimit -u, RLIMIT_AS).
WORKERS_LIMITED = r"""
import sys
from gdscp import _core
_core.testing.arm_worker_limit(int(sys.argv[1]))
sys.argv = ["gdscp", *sys.argv[2:]]
from gdscp.cli.main import main
main()
"""


def _workers_limited(limit: int, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", WORKERS_LIMITED, str(limit), *args], env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_a_thread_count_the_system_refuses_at_the_start_is_a_warning():
    """GDSCP_NUM_THREADS beyond the threads the system gives: the command runs
    with the workers that started, said in one warning line naming the
    variable and the count reached."""
    import json

    result = _workers_limited(3, "info", "--json", env={"GDSCP_NUM_THREADS": "300"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["settings"]["num_threads"] == 3
    [line] = result.stderr.splitlines()
    assert line.startswith("gdscp info: warning: GDSCP_NUM_THREADS=300: the I/O thread pool could not grow to 300 "
                           "workers (cannot start thread gdscp-io-3: "), line
    assert line.endswith("it runs 3 workers"), line


def test_threads_on_the_command_line_come_before_the_environment(tmp_path):
    """--threads is the count the workers start at: GDSCP_NUM_THREADS, which
    the system has no threads for here, is never tried (nothing warns of it)."""
    import json

    (tmp_path / "s").write_bytes(os.urandom(100 * 1024))
    result = _workers_limited(6, "copy", "--json", "--threads", "4", str(tmp_path / "s"), str(tmp_path / "d"),
                              env={"GDSCP_NUM_THREADS": "300"})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout)["ok"] is True
    assert (tmp_path / "d").read_bytes() == (tmp_path / "s").read_bytes()


def test_threads_the_system_refuses_are_the_commands_error(tmp_path):
    """A --threads count the system has no threads for is the command's
    failure, said once, as a set() the system refuses raises."""
    (tmp_path / "s").write_bytes(b"x" * 1000)
    result = _workers_limited(3, "copy", "--threads=5", str(tmp_path / "s"), str(tmp_path / "d"))
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("gdscp copy: error: RuntimeError: the I/O thread pool could not grow to 5 workers"), line
    assert line.endswith("it runs 3 workers"), line
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("json_asked", [False, True])
def test_no_worker_thread_at_all_is_one_line(json_asked):
    import json

    result = _workers_limited(0, "info", *(["--json"] if json_asked else []))
    assert result.returncode == 1, result.stderr
    said = "cannot start: RuntimeError: the I/O thread pool could not start any worker: cannot start thread gdscp-io-0: "
    [line] = result.stderr.splitlines()
    assert line.startswith(f"gdscp info: error: {said}"), line
    if json_asked:
        doc = json.loads(result.stdout)
        assert doc["ok"] is False and doc["exit_code"] == 1 and doc["error"].startswith(said)
    else:
        assert result.stdout == ""


@pytest.mark.parametrize("given", [None, "3"])
@pytest.mark.parametrize("command", ["write", "read"])
def test_numpy_blas_runs_on_one_thread_unless_the_user_says(tmp_path, given, command):
    """The command does no linear algebra: OpenBLAS, which numpy starts as it
    loads, is held to one thread (where a pids limit refuses it a thread, it
    raises SIGINT: the command would end as interrupted), unless the user set
    OPENBLAS_NUM_THREADS."""
    (tmp_path / "f").write_bytes(b"x" * 1024)
    env = {} if given is None else {"OPENBLAS_NUM_THREADS": given}
    full_env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    full_env.update(env)
    args = (command, str(tmp_path / "f"), "--host", *(["--size", "1K"] if command == "write" else []))
    result = subprocess.run([sys.executable, "-c", CHILD, "blas", "numpy", "0", *args], env=full_env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"OPENBLAS_NUM_THREADS={given or '1'}\n" in result.stderr
