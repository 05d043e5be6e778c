"""gdscp.defaults: KvikIO's settings interface, validation and GDSCP_* variables."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import gdscp
from gdscp import CompatMode, _core, defaults

MiB = 1 << 20

SETTINGS = [
    "compat_mode",
    "num_threads",
    "task_size",
    "gds_threshold",
    "bounce_buffer_size",
    "min_task_size",
    "direct_io",
    "pipeline_depth",
    "mapped_reads",
]


@pytest.fixture(autouse=True)
def restore_settings():
    """Tests here change settings outside ``with`` blocks; put every one back."""
    saved = {name: defaults.get(name) for name in SETTINGS}
    yield
    defaults.set(saved)


def test_get_every_setting():
    assert isinstance(defaults.get("compat_mode"), CompatMode)
    for name in ["num_threads", "task_size", "gds_threshold", "bounce_buffer_size", "min_task_size"]:
        value = defaults.get(name)
        assert isinstance(value, int) and not isinstance(value, bool), name
    assert defaults.get("direct_io") in ("on", "off", "auto")
    assert 2 <= defaults.get("pipeline_depth") <= 8
    assert defaults.get("num_threads") >= 1
    assert defaults.get("task_size") >= 1


def test_default_num_threads_suits_machine():
    # Without GDSCP_NUM_THREADS the pool is not KvikIO's single thread.
    code = "import gdscp; print(gdscp.defaults.get('num_threads'))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) > 1


def test_default_num_threads_is_one_per_cpu_from_4_to_32():
    """Python's default and the engine's pool agree: one worker per CPU, at
    least 4 and at most 32."""
    code = "import gdscp; print(gdscp.defaults.get('num_threads'), gdscp._core.num_threads())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    expected = max(4, min(os.cpu_count() or 1, 32))
    assert [int(n) for n in out.stdout.split()] == [expected, expected]


def test_default_bounce_buffer_shares_128_mib_among_the_default_workers():
    """Without GDSCP_BOUNCE_BUFFER_SIZE, the staging buffer is sized so that
    the default workers' two buffers each total 128 MiB: 4 MiB up to 16 CPUs,
    2 MiB at 32, whole MiB, never below 1 MiB or above 4 MiB."""
    code = "import gdscp; print(gdscp.defaults.get('num_threads'), gdscp.defaults.get('bounce_buffer_size'))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    threads, bounce = (int(n) for n in out.stdout.split())
    assert bounce == min(4 * MiB, max(MiB, (128 * MiB // (2 * threads)) // MiB * MiB))
    assert threads > 16 or bounce == 4 * MiB


def test_task_size_of_one_call_leaves_the_setting(tmp_file):
    """``task_size=`` on a call runs that request with it; the process-wide
    setting, and the next call, keep theirs."""
    path, data = tmp_file(MiB + 5)
    buf = np.zeros(len(data), np.uint8)
    before = defaults.get("task_size")
    with gdscp.CuFile(path) as f:
        assert f.read(buf, task_size=8192) == len(data)
    assert buf.tobytes() == data
    assert defaults.get("task_size") == before
    assert defaults._settings.task_size == before


def test_set_name_value_and_get():
    defaults.set("task_size", 123_456)
    assert defaults.get("task_size") == 123_456


def test_set_dict_applies_all():
    defaults.set({"task_size": 8192, "gds_threshold": 0, "num_threads": 3})
    assert defaults.get("task_size") == 8192
    assert defaults.get("gds_threshold") == 0
    assert defaults.get("num_threads") == 3
    assert _core.num_threads() == 3


def test_set_as_context_manager_restores():
    before = {name: defaults.get(name) for name in SETTINGS}
    with defaults.set("task_size", 4096):
        assert defaults.get("task_size") == 4096
        flipped = "off" if before["direct_io"] != "off" else "on"
        with defaults.set({"num_threads": 2, "direct_io": flipped}):
            assert defaults.get("num_threads") == 2
            assert _core.num_threads() == 2
            assert defaults.get("direct_io") == flipped
        assert defaults.get("num_threads") == before["num_threads"]
        assert _core.num_threads() == before["num_threads"]
    assert {name: defaults.get(name) for name in SETTINGS} == before


def test_context_manager_restores_after_exception():
    before = defaults.get("task_size")
    with pytest.raises(ZeroDivisionError):
        with defaults.set("task_size", 77):
            1 / 0
    assert defaults.get("task_size") == before


# --------------------------------------------------------------------------
# values: what KvikIO accepts works, and what it refuses raises its exception type
# --------------------------------------------------------------------------
POSITIVE = ["num_threads", "task_size", "bounce_buffer_size", "min_task_size"]


@pytest.mark.parametrize("name", POSITIVE + ["gds_threshold"])
@pytest.mark.parametrize(
    "value, error",
    [
        (-1, OverflowError),
        (-4096, OverflowError),
        (2**64, OverflowError),
        (float("inf"), OverflowError),
        (float("nan"), ValueError),
        ("4096", TypeError),
        ("", TypeError),
        (None, TypeError),
        ([4096], TypeError),
    ],
)
def test_bad_counts_and_sizes_raise_kvikios_exception_types(name, value, error):
    before = defaults.get(name)
    with pytest.raises(error) as info:
        defaults.set(name, value)
    assert name in str(info.value)
    assert defaults.get(name) == before


ALL_SETTINGS = ["compat_mode", "num_threads", "task_size", "gds_threshold", "bounce_buffer_size", "min_task_size",
                "direct_io", "pipeline_depth", "mapped_reads"]


@pytest.mark.parametrize("name", ALL_SETTINGS)
@pytest.mark.parametrize("value", [10**5000, -(10**5000)], ids=["huge", "huge-negative"])
def test_numbers_of_thousands_of_digits_are_named_by_their_length(name, value):
    """An int longer than Python writes as text (4300 digits) raises what a
    smaller wrong number raises (an OverflowError for a count or size, the
    ValueError of a switch), naming the setting and the number's length,
    and changes nothing."""
    before = defaults.get(name)
    error = ValueError if name in ("direct_io", "mapped_reads") else OverflowError
    with pytest.raises(error) as info:
        defaults.set(name, value)
    assert type(info.value) is error
    assert name in str(info.value) and "number of 5001 digits" in str(info.value)
    assert ("negative" in str(info.value)) == (value < 0)
    assert defaults.get(name) == before


def test_a_number_of_a_million_bits_is_named_by_its_length_about():
    """Past 100,000 digits the count comes from the bit length alone (the
    power of ten a count to the digit needs would take seconds to make):
    exact, or one short."""
    for value, digits in ((1 << 10**6, 301030), (-(1 << 10**6), 301030), (10**200000, 200000)):
        with pytest.raises(OverflowError) as info:
            defaults.set("task_size", value)
        sign = "negative " if value < 0 else ""
        assert f"task_size (a {sign}number of about {digits} digits)" in str(info.value)


@pytest.mark.parametrize("name", POSITIVE)
@pytest.mark.parametrize("value", [0, 0.5, False])
def test_zero_is_a_value_error_where_a_setting_must_be_positive(name, value):
    before = defaults.get(name)
    with pytest.raises(ValueError, match=name):
        defaults.set(name, value)
    assert defaults.get(name) == before


def _worker_threads() -> int:
    """The engine's worker threads in this process, parked ones too."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().startswith("gdscp-io-")
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return count


@pytest.mark.parametrize("value", [defaults.MAX_NUM_THREADS + 1, 100_000, 2**32 - 1])
def test_num_threads_above_the_maximum_starts_no_thread(value, tmp_file):
    """KvikIO takes any thread count its C++ type holds and tries to start
    them all; gdscp refuses more than MAX_NUM_THREADS with a ValueError naming
    the maximum before any thread starts, and the pool runs on as it was."""
    assert defaults.MAX_NUM_THREADS == 4096
    before, threads = defaults.get("num_threads"), _worker_threads()
    for setter in (lambda: defaults.set("num_threads", value), lambda: defaults.num_threads_reset(value)):
        with pytest.raises(ValueError, match=f"num_threads must be at most 4096 \\(got {value}\\)"), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # num_threads_reset's, tested below
            setter()
        assert defaults.get("num_threads") == before == _core.num_threads()
        assert _worker_threads() == threads
    # The engine refuses it too, whoever calls it.
    with pytest.raises(ValueError, match=f"at most 4096 \\(got {value}\\)"):
        _core.set_num_threads(value)
    assert _core.num_threads() == before and _worker_threads() == threads
    path, data = tmp_file(3 * MiB + 7)
    buf = np.zeros(len(data), np.uint8)
    with defaults.set("gds_threshold", 0), gdscp.CuFile(path, "r") as f:
        assert f.read(buf, task_size=64 << 10) == len(data)
    assert buf.tobytes() == data


@pytest.mark.parametrize(
    "name, value, expect",
    [
        ("num_threads", 1.5, 1),  # KvikIO truncates floats
        ("num_threads", True, 1),
        ("num_threads", np.int64(3), 3),
        ("task_size", 1, 1),
        ("task_size", 4096.0, 4096),
        ("task_size", 2**64 - 1, 2**64 - 1),
        ("gds_threshold", 0, 0),
        ("gds_threshold", 1.5, 1),
        ("bounce_buffer_size", 1, 1),
        ("bounce_buffer_size", 3, 3),
        ("min_task_size", 1, 1),
        ("compat_mode", 1.5, CompatMode.ON),
        ("compat_mode", 2, CompatMode.AUTO),
    ],
)
def test_values_kvikio_accepts(name, value, expect):
    with defaults.set(name, value):
        got = defaults.get(name)
        assert got == expect and type(got) is type(expect)


class _Number:
    def __init__(self, n: int):
        self.n = n


class _IntOnly(_Number):
    def __int__(self) -> int:
        return self.n


class _IndexOnly(_Number):
    def __index__(self) -> int:
        return self.n


class _IntAndIndex(_IntOnly):
    def __index__(self) -> int:
        return self.n + 1000  # int() asks __int__ first, as KvikIO's binding does


class _FloatOnly(_Number):
    def __float__(self) -> float:
        return float(self.n)


class _TruncOnly(_Number):
    def __trunc__(self) -> int:
        return self.n


@pytest.mark.parametrize("name, n", [("num_threads", 3), ("task_size", 8192), ("gds_threshold", 8192),
                                     ("bounce_buffer_size", 8192), ("min_task_size", 8192)])
@pytest.mark.parametrize(
    "make",
    [
        lambda n: Decimal(n) + Decimal("0.5"),
        lambda n: Fraction(2 * n + 1, 2),
        _IntOnly,
        _IndexOnly,
        _IntAndIndex,
        lambda n: np.float32(n),
        lambda n: np.timedelta64(n),
        lambda n: np.array(n),
    ],
    ids=["Decimal", "Fraction", "__int__", "__index__", "__int__-and-__index__", "numpy-float32",
         "numpy-timedelta64", "numpy-0d-array"],
)
def test_numbers_go_through_int_as_in_kvikio(name, n, make):
    """KvikIO's binding takes any object Python counts as a number and
    converts it with int(): Decimal and Fraction are truncated, an object
    with only __int__ (or only __index__) is taken, __int__ before __index__."""
    with defaults.set(name, make(n)):
        got = defaults.get(name)
        assert got == n and type(got) is int
        if name != "num_threads":
            assert getattr(defaults._settings, name) == max(n, defaults._ENGINE_MINIMUM.get(name, 0))


class _Huge(Decimal):
    """A Decimal too large for any setting, whose int() (hours for 1e100000000)
    must not be asked for."""

    def __int__(self) -> int:
        raise AssertionError("int() of a Decimal out of every range")


@pytest.mark.parametrize(
    "value, error",
    [
        (Decimal("NaN"), ValueError),
        (Decimal("Infinity"), OverflowError),
        (_Huge("1e100000000"), OverflowError),  # refused before int(), which would take hours
        (_Huge("-1e100000000"), OverflowError),
        (Decimal("-1.5"), OverflowError),
        (Decimal("0.5"), ValueError),  # int() makes it 0, which task_size refuses
        (_IntOnly(-5), OverflowError),
        (_FloatOnly(8192), TypeError),  # a number, but int() refuses it
        (_TruncOnly(8192), TypeError),  # not a number to Python's C API
        (8192 + 0j, TypeError),
        (np.str_("8192"), TypeError),
        (np.bytes_(b"8192"), TypeError),
        (np.datetime64(8192, "s"), TypeError),
        (np.array([8192]), TypeError),
        (datetime.timedelta(1), TypeError),
        (bytearray(b"8192"), TypeError),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, type) else v.__name__,
)
def test_values_kvikios_binding_refuses(value, error):
    before = defaults.get("task_size")
    with pytest.raises(error, match="task_size"):
        defaults.set("task_size", value)
    assert defaults.get("task_size") == before


def test_sizes_below_a_page_are_kept_and_the_engine_gets_a_page():
    """get() returns what was set; the engine stages and splits in at least a
    page, which moves the same bytes faster (test_small_sizes_move_exact_bytes)."""
    with defaults.set({"task_size": 1, "bounce_buffer_size": 3, "min_task_size": 100}):
        assert (defaults.get("task_size"), defaults.get("bounce_buffer_size")) == (1, 3)
        assert defaults.get("min_task_size") == 100
        assert (defaults._settings.task_size, defaults._settings.bounce_buffer_size) == (4096, 4096)
    with defaults.set({"task_size": 4097, "bounce_buffer_size": 8191}):
        assert (defaults._settings.task_size, defaults._settings.bounce_buffer_size) == (4097, 8191)


@pytest.mark.parametrize("setting, value", [("bounce_buffer_size", 1), ("bounce_buffer_size", 3),
                                            ("bounce_buffer_size", 4095), ("task_size", 1),
                                            ("task_size", 100), ("task_size", 4095)])
def test_small_sizes_move_exact_bytes(tmp_file, tmp_path, setting, value):
    """Host memory, through the pool (gds_threshold 0) and O_DIRECT (direct_io on);
    the device path: test_cufile_standin.py::test_small_sizes_through_device_memory."""
    path, data = tmp_file(3 * MiB + 4097)
    out = str(tmp_path / "out.bin")
    with defaults.set({setting: value, "gds_threshold": 0, "num_threads": 4, "direct_io": "on"}):
        buf = np.full(len(data), 0xA5, np.uint8)
        with gdscp.CuFile(path) as f:
            assert f.read(buf) == len(data)
            part = np.full(5000, 0xA5, np.uint8)
            assert f.pread(part, 4999, 12345, task_size=value if setting == "task_size" else None).get() == 4999
        assert buf.tobytes() == data
        assert part[:4999].tobytes() == data[12345 : 12345 + 4999] and part[4999] == 0xA5
        with gdscp.CuFile(out, "w+") as f:
            assert f.write(buf[1:]) == len(data) - 1
            assert f.write(buf[:1], file_offset=len(data) - 1) == 1
    with open(out, "rb") as f:
        assert f.read() == data[1:] + data[:1]


def test_bad_call_forms_are_value_and_type_errors():
    """KvikIO raises ValueError for these; Python would raise TypeError: both catch it."""
    for args in [("task_size",), (), ("task_size", 1, 2), (5, 1), ([("task_size", 1)],)]:
        with pytest.raises(ValueError):
            defaults.set(*args)
        with pytest.raises(TypeError):
            defaults.set(*args)


def test_compat_mode_strings_are_gdscps_extension():
    with defaults.set("compat_mode", "off"):
        assert defaults.get("compat_mode") is CompatMode.OFF
    with pytest.raises(ValueError, match="compat_mode"):
        defaults.set("compat_mode", "sometimes")


@pytest.mark.parametrize(
    "value, error",
    [("maybe", ValueError), ("", ValueError), (3, ValueError), (-1, OverflowError), (None, TypeError),
     (object(), TypeError)],
)
def test_invalid_compat_mode(value, error):
    before = defaults.get("compat_mode")
    with pytest.raises(error, match="compat_mode"):
        defaults.set("compat_mode", value)
    assert defaults.get("compat_mode") == before


@pytest.mark.parametrize("value, error", [("perhaps", ValueError), (2, ValueError), (-1, ValueError), (None, TypeError)])
def test_invalid_direct_io(value, error):
    with pytest.raises(error, match="direct_io"):
        defaults.set("direct_io", value)


@pytest.mark.parametrize("name, value, said", [
    ("direct_io", None, "direct_io must be on, off or auto (or a bool), not NoneType"),
    ("direct_io", [1], "direct_io must be on, off or auto (or a bool), not list"),
    ("mapped_reads", None, "mapped_reads must be true or false (a bool, 0 or 1), not NoneType"),
    ("mapped_reads", b"yes", "mapped_reads must be true or false (a bool, 0 or 1), not bytes"),
    ("compat_mode", None, "compat_mode must be a CompatMode, 0, 1, 2 or ON, OFF or AUTO, not NoneType"),
    ("compat_mode", object(), "compat_mode must be a CompatMode, 0, 1, 2 or ON, OFF or AUTO, not object"),
])
def test_a_value_of_the_wrong_type_is_told_what_the_setting_takes(name, value, said):
    """A TypeError for a setting that is no number says what it takes, not
    that it "must be an integer"; nothing changes."""
    before = defaults.get(name)
    with pytest.raises(TypeError) as info:
        defaults.set(name, value)
    assert str(info.value) == said
    assert defaults.get(name) == before


@pytest.mark.parametrize(
    "value, expect",
    [
        (CompatMode.ON, CompatMode.ON),
        (CompatMode.OFF, CompatMode.OFF),
        (CompatMode.AUTO, CompatMode.AUTO),
        (True, CompatMode.ON),
        (False, CompatMode.OFF),
        (0, CompatMode.OFF),
        ("on", CompatMode.ON),
        ("off", CompatMode.OFF),
        ("auto", CompatMode.AUTO),
        ("ON", CompatMode.ON),
        ("Auto", CompatMode.AUTO),
    ],
)
def test_compat_mode_values(value, expect):
    with defaults.set("compat_mode", value):
        got = defaults.get("compat_mode")
        assert got is expect
        with pytest.warns(FutureWarning):
            assert defaults.compat_mode() is expect


def test_is_compat_mode_preferred():
    with defaults.set("compat_mode", "on"):
        assert defaults.is_compat_mode_preferred() is True
    with defaults.set("compat_mode", "off"):
        assert defaults.is_compat_mode_preferred() is False
    with defaults.set("compat_mode", "auto"):
        nvidia_fs = os.path.exists("/proc/driver/nvidia-fs/version")
        assert defaults.is_compat_mode_preferred() is (not nvidia_fs)


@pytest.mark.parametrize(
    "value, expect",
    [(True, "on"), (False, "off"), ("1", "on"), ("off", "off"), ("on", "on"), ("AUTO", "auto"), ("auto", "auto")],
)
def test_direct_io_values(value, expect):
    with defaults.set("direct_io", value):
        assert defaults.get("direct_io") == expect


@pytest.mark.parametrize("value, error", [(1, ValueError), (9, ValueError), (0, ValueError), (-2, OverflowError),
                                          ("deep", TypeError), (None, TypeError)])
def test_invalid_pipeline_depth(value, error):
    with pytest.raises(error, match="pipeline_depth"):
        defaults.set("pipeline_depth", value)


def test_pipeline_depth_range():
    for depth in (2, 8):
        with defaults.set("pipeline_depth", depth):
            assert defaults.get("pipeline_depth") == depth


def test_unknown_names_raise_key_error():
    with pytest.raises(KeyError, match="no_such_setting"):
        defaults.get("no_such_setting")
    with pytest.raises(KeyError, match="no_such_setting"):
        defaults.set("no_such_setting", 1)
    with pytest.raises(KeyError, match="no_such_setting"):
        defaults.set({"task_size": 4096, "no_such_setting": 1})
    with pytest.raises(KeyError):
        defaults.get(5)
    with pytest.raises(KeyError):
        defaults.set({5: 1})


@pytest.mark.parametrize(
    "name", ["http_max_attempts", "http_status_codes", "http_timeout", "remote_io_backend", "remote_io_num_reactors"]
)
def test_remote_file_settings_are_not_supported(name):
    """KvikIO's remote-file settings: a RuntimeError (as KvikIO raises without
    remote support) that says so, and never a silent value."""
    for call in (lambda: defaults.get(name), lambda: defaults.set(name, 1), lambda: defaults.set({name: 1})):
        with pytest.raises(NotImplementedError, match="remote files") as info:
            call()
        assert isinstance(info.value, RuntimeError)
        assert name in str(info.value)


@pytest.mark.parametrize(
    "read, write, direct_io", [(False, True, "auto"), (True, True, "on"), (False, False, "off")]
)
def test_kvikio_direct_io_switches_are_views_of_direct_io(read, write, direct_io):
    with defaults.set("direct_io", "off"):
        with defaults.set({"auto_direct_io_read": read, "auto_direct_io_write": write}):
            assert defaults.get("direct_io") == direct_io
            assert (defaults.get("auto_direct_io_read"), defaults.get("auto_direct_io_write")) == (read, write)
            assert defaults._settings.direct_io.name == direct_io
        assert defaults.get("direct_io") == "off"
    with defaults.set("direct_io", "auto"):  # KvikIO's defaults: reads buffered, writes direct
        assert (defaults.get("auto_direct_io_read"), defaults.get("auto_direct_io_write")) == (False, True)
        with defaults.set("auto_direct_io_read", 1):  # any truth value, as KvikIO takes
            assert defaults.get("direct_io") == "on"


def test_direct_reads_with_buffered_writes_is_refused():
    with defaults.set("direct_io", "off"):
        with pytest.raises(ValueError, match="auto_direct_io_read"):
            defaults.set("auto_direct_io_read", True)
        assert defaults.get("direct_io") == "off"


def test_set_dict_is_all_or_nothing():
    before = {name: defaults.get(name) for name in SETTINGS}
    with pytest.raises(ValueError, match="num_threads"):
        defaults.set({"task_size": 4096, "num_threads": 0})
    with pytest.raises(KeyError):
        defaults.set({"task_size": 4096, "bogus": 1})
    assert {name: defaults.get(name) for name in SETTINGS} == before


# --------------------------------------------------------------------------
# KvikIO's older accessors
# --------------------------------------------------------------------------
LEGACY = {
    "compat_mode": (), "compat_mode_reset": (CompatMode.OFF,), "set_compat_mode": (CompatMode.OFF,),
    "num_threads": (), "get_num_threads": (), "num_threads_reset": (3,), "set_num_threads": (3,),
    "task_size": (), "task_size_reset": (8192,), "set_task_size": (8192,),
    "gds_threshold": (), "gds_threshold_reset": (4096,), "set_gds_threshold": (4096,),
    "bounce_buffer_size": (), "bounce_buffer_size_reset": (1 << 16,), "set_bounce_buffer_size": (1 << 16,),
}


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_legacy_accessors_warn_at_the_callers_line(name):
    """KvikIO deprecates its older accessors with a FutureWarning (and has
    dropped get_num_threads); gdscp's warn alike, once per call, naming the
    line that called them and what to use instead."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        getattr(defaults, name)(*LEGACY[name]); line = sys._getframe().f_lineno  # noqa: E702
    assert [w.category for w in seen] == [FutureWarning]
    assert (seen[0].filename, seen[0].lineno) == (__file__, line)
    assert f"defaults.{name}() is deprecated" in str(seen[0].message)
    assert "defaults.get(" in str(seen[0].message) or "defaults.set(" in str(seen[0].message)


@pytest.mark.parametrize(
    "name, value",
    [
        ("num_threads", 5),
        ("task_size", 1 << 18),
        ("gds_threshold", 12345),
        ("bounce_buffer_size", 1 << 16),
        ("compat_mode", CompatMode.ON),
    ],
)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_legacy_accessors(name, value):
    getter = getattr(defaults, name)
    reset = getattr(defaults, name + "_reset")
    reset(value)
    assert getter() == value
    assert defaults.get(name) == value
    if name == "num_threads":
        assert _core.num_threads() == value


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_legacy_reset_validates():
    with pytest.raises(ValueError, match="num_threads"):
        defaults.num_threads_reset(0)
    with pytest.raises(OverflowError, match="task_size"):
        defaults.task_size_reset(-5)
    with pytest.raises(ValueError, match="compat_mode"):
        defaults.compat_mode_reset("sometimes")


@pytest.mark.parametrize(
    "name, value",
    [("compat_mode", CompatMode.ON), ("num_threads", 3), ("task_size", 8192), ("gds_threshold", 7),
     ("bounce_buffer_size", 1 << 16)],
)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_legacy_set_context_managers_nest(name, value):
    """KvikIO's older ``with set_task_size(n):`` form, nested in ``set()`` blocks."""
    before = defaults.get(name)
    with getattr(defaults, "set_" + name)(value):
        assert defaults.get(name) == value
        with defaults.set(name, before):
            assert defaults.get(name) == before
        assert defaults.get(name) == value
    assert defaults.get(name) == before
    assert defaults.get_num_threads() == defaults.get("num_threads")


def test_defaults_exports_only_its_own_names():
    public = {name for name in dir(defaults) if not name.startswith("_")}
    assert public == set(defaults.__all__)
    assert len(defaults.__all__) == len(set(defaults.__all__))
    for name in defaults.__all__:
        obj = getattr(defaults, name)
        assert getattr(obj, "__module__", "gdscp.defaults") == "gdscp.defaults", name


def test_settings_take_effect_on_io(tmp_file):
    path, data = tmp_file(3 * MiB + 7)
    buf = np.zeros(len(data), np.uint8)
    for threads in (1, 7):
        with defaults.set({"num_threads": threads, "task_size": 100_000, "gds_threshold": 0}):
            with gdscp.CuFile(path) as f:
                assert f.read(buf) == len(data)
        assert buf.tobytes() == data
        buf[:] = 0


# --------------------------------------------------------------------------
# environment variables, read once at import
# --------------------------------------------------------------------------
def _run_with_env(env_update: dict[str, str], code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    env.update(env_update)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_environment_variables_set_defaults():
    code = (
        "import gdscp, json\n"
        "from gdscp import defaults, _core\n"
        "names = ['compat_mode','num_threads','task_size','gds_threshold','bounce_buffer_size',"
        "'min_task_size','direct_io','pipeline_depth','mapped_reads']\n"
        "out = {n: (defaults.get(n).name if n == 'compat_mode' else defaults.get(n)) for n in names}\n"
        "out['engine_threads'] = _core.num_threads()\n"
        "print(json.dumps(out))\n"
    )
    result = _run_with_env(
        {
            "GDSCP_COMPAT_MODE": "on",
            "GDSCP_NUM_THREADS": "3",
            "GDSCP_TASK_SIZE": "65536",
            "GDSCP_GDS_THRESHOLD": "0",
            "GDSCP_BOUNCE_BUFFER_SIZE": "131072",
            "GDSCP_MIN_TASK_SIZE": "8192",
            "GDSCP_DIRECT_IO": "1",
            "GDSCP_PIPELINE_DEPTH": "5",
            "GDSCP_MAPPED_READS": "off",
        },
        code,
    )
    assert result.returncode == 0, result.stderr
    import json

    got = json.loads(result.stdout)
    assert got == {
        "compat_mode": "ON",
        "num_threads": 3,
        "task_size": 65536,
        "gds_threshold": 0,
        "bounce_buffer_size": 131072,
        "min_task_size": 8192,
        "direct_io": "on",
        "pipeline_depth": 5,
        "mapped_reads": False,
        "engine_threads": 3,
    }


# The engine's pool refused every worker from index argv[1] on, as by a system
# out of threads, before gdscp.defaults loads; argv[2] is a scratch file.
_POOL_REFUSED_AT_IMPORT = r"""
import json, sys, warnings
import numpy as np
from gdscp import _core

_core.testing.arm_worker_limit(int(sys.argv[1]))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import gdscp
    from gdscp import defaults
running = _core.num_threads()
report = {"running": running, "setting": defaults.get("num_threads"),
          "warnings": [[w.category.__name__, str(w.message)] for w in caught]}

# The workers that started take every task: a read in many more tasks than workers.
data = np.random.default_rng(5).integers(0, 256, 4 << 20, dtype=np.uint8)
data.tofile(sys.argv[2])
out = np.zeros_like(data)
with gdscp.CuFile(sys.argv[2], "r") as f:
    assert f.read(out, task_size=64 << 10) == data.nbytes
assert np.array_equal(out, data)

# A count set() asks for and the system refuses still raises; the pool runs what it has.
try:
    defaults.set("num_threads", running + 2)
except RuntimeError as e:
    report["refused"] = str(e)
report["after_refusal"] = [defaults.get("num_threads"), _core.num_threads()]
defaults.set("num_threads", 2)
report["fewer"] = [defaults.get("num_threads"), _core.num_threads()]
_core.testing.disarm_fault()
defaults.set("num_threads", running + 2)
report["more"] = [defaults.get("num_threads"), _core.num_threads()]
print(json.dumps(report))
"""


@pytest.mark.parametrize("variable, asked", [("300", "GDSCP_NUM_THREADS=300"), (None, "the default num_threads")])
def test_a_first_count_the_system_refuses_runs_the_workers_started(tmp_path, variable, asked):
    """GDSCP_NUM_THREADS (or the built-in count) that the system has no
    threads for as gdscp.defaults loads (a pids limit, ulimit -u, RLIMIT_AS):
    the import works, the pool runs the workers that started, get() says how
    many, and one RuntimeWarning says where the count came from and how many
    run. Failing the import left all of gdscp unusable, set() included, though
    workers ran."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    if variable is not None:
        env["GDSCP_NUM_THREADS"] = variable
    result = subprocess.run([sys.executable, "-c", _POOL_REFUSED_AT_IMPORT, "3", str(tmp_path / "data.bin")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["running"] == report["setting"] == 3
    [(category, message)] = report["warnings"]
    assert category == "RuntimeWarning"
    assert message.startswith(asked) and "could not grow to" in message and "it runs 3 workers" in message
    assert "gdscp-io-3" in message and "errno 11" in message
    assert "could not grow to 5 workers" in report["refused"] and "it runs 3 workers" in report["refused"]
    assert report["after_refusal"] == [3, 3]
    assert report["fewer"] == [2, 2]
    assert report["more"] == [5, 5]


def test_a_pool_that_can_start_no_worker_fails_the_import():
    """No worker at all: nothing to run with, and the import says why."""
    code = (
        "from gdscp import _core\n"
        "_core.testing.arm_worker_limit(0)\n"
        "from gdscp import defaults\n"
    )
    result = _run_with_env({}, code)
    assert result.returncode == 1
    assert "RuntimeError: the I/O thread pool could not start any worker" in result.stderr, result.stderr


def test_environment_compat_mode_auto_and_off():
    code = "import gdscp; print(gdscp.defaults.get('compat_mode').name)"
    assert _run_with_env({"GDSCP_COMPAT_MODE": "OFF"}, code).stdout.strip() == "OFF"
    assert _run_with_env({"GDSCP_COMPAT_MODE": "auto"}, code).stdout.strip() == "AUTO"


@pytest.mark.parametrize(
    "variable, value, accepted",
    [
        ("GDSCP_NUM_THREADS", "0", "from 1 to 4096"),
        ("GDSCP_NUM_THREADS", "4M", "from 1 to 4096"),
        ("GDSCP_NUM_THREADS", "4097", "from 1 to 4096"),
        ("GDSCP_NUM_THREADS", "1_0", "from 1 to 4096"),
        ("GDSCP_NUM_THREADS", "+-5", "from 1 to 4096"),
        ("GDSCP_PIPELINE_DEPTH", "\u0663", "from 2 to 8"),
        ("GDSCP_TASK_SIZE", "big", "size such as 4096, 4K"),
        ("GDSCP_GDS_THRESHOLD", "-1", "size such as 4096, 4K"),
        ("GDSCP_COMPAT_MODE", "sometimes", "ON, OFF or AUTO"),
        ("GDSCP_BOUNCE_BUFFER_SIZE", "-4096", "size such as 4096, 4K"),
        ("GDSCP_BOUNCE_BUFFER_SIZE", "0", "positive size"),
        ("GDSCP_DIRECT_IO", "sideways", "on, off or auto"),
        ("GDSCP_PIPELINE_DEPTH", "9", "from 2 to 8"),
        ("GDSCP_MAPPED_READS", "maybe", "true or false"),
    ],
)
def test_bad_environment_value_names_the_variable(variable, value, accepted):
    """A clear ValueError naming the variable, its value and what it takes,
    when gdscp first needs its settings: each said once (a check that only
    says what the variable must be is not said beside what it takes)."""
    code = (
        "import sys, gdscp\n"
        "try:\n"
        "    gdscp.defaults\n"
        "except ValueError as exc:\n"
        "    print(type(exc).__name__, exc.variable, '|', exc)\n"
        "    sys.exit(3)\n"
    )
    result = _run_with_env({variable: value}, code)
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout.startswith(f"EnvironmentVariableError {variable} |")
    message = result.stdout.split("|", 1)[1]
    assert variable in message and repr(value) in message and accepted in message
    assert message.count(variable) == 2 and message.count(accepted) == 1, message  # "V='x' ...; V takes ..."
    assert "\n" not in message.strip()


@pytest.mark.parametrize(
    "variable, value, said",
    [
        ("GDSCP_TASK_SIZE", "99999999999999999999999999999",
         "GDSCP_TASK_SIZE 99999999999999999999999999999 is out of range"),
        ("GDSCP_TASK_SIZE", "17592186044415.999999999999999K",
         "is not a whole number of bytes (18014398509481983.999999999998976 bytes)"),
        ("GDSCP_TASK_SIZE", "\u0668", "'\u0668' is not a size"),
        ("GDSCP_GDS_THRESHOLD", "9" * 5000, "is not a size: 5000 characters, more than the 100 read"),
        ("GDSCP_NUM_THREADS", "9" * 5000, "is not a whole number: 5000 characters, more than the 100 read"),
    ],
)
def test_numbers_in_variables_are_read_exactly(variable, value, said):
    """A size variable is computed exactly, and its error shows the value
    given (not one rounded to 28 digits); a long value is refused for its
    length, not for a number Python will not convert; digits are ASCII."""
    code = (
        "import sys, gdscp\n"
        "try:\n"
        "    gdscp.defaults\n"
        "except ValueError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "    sys.exit(3)\n"
    )
    result = _run_with_env({variable: value}, code)
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout.startswith(f"EnvironmentVariableError {variable}=") and said in result.stdout, result.stdout


def test_size_variables_take_the_command_lines_suffixes():
    code = "import gdscp, json; print(json.dumps(gdscp.defaults.current()))"
    result = _run_with_env(
        {"GDSCP_TASK_SIZE": "4M", "GDSCP_GDS_THRESHOLD": "64KiB", "GDSCP_BOUNCE_BUFFER_SIZE": "1.5MiB",
         "GDSCP_MIN_TASK_SIZE": "1KB"},
        code,
    )
    assert result.returncode == 0, result.stderr
    import json

    got = json.loads(result.stdout)
    assert (got["task_size"], got["gds_threshold"]) == (4 << 20, 64 << 10)
    assert (got["bounce_buffer_size"], got["min_task_size"]) == (3 << 19, 1000)


# --------------------------------------------------------------------------
# changing the pool under a running transfer
# --------------------------------------------------------------------------
def test_resize_pool_while_read_in_flight(tmp_file):
    size = 24 * MiB + 5
    path, data = tmp_file(size)
    buf = np.zeros(size, np.uint8)
    with defaults.set({"num_threads": 4, "gds_threshold": 0}), gdscp.CuFile(path) as f:
        future = f.pread(buf, task_size=64 * 1024)
        for n in (1, 8, 2, 16, 3, 1, 6):
            defaults.set("num_threads", n)
        assert future.get() == size
    assert buf.tobytes() == data


def test_resize_pool_while_other_thread_reads(tmp_file, tmp_path):
    size = 8 * MiB + 3
    path, data = tmp_file(size)
    out_path = str(tmp_path / "copy.bin")
    errors: list[BaseException] = []
    results: list[bool] = []
    stop = threading.Event()

    def worker():
        try:
            buf = np.zeros(size, np.uint8)
            with gdscp.CuFile(path) as f, gdscp.CuFile(out_path, "w+") as out:
                for _ in range(6):
                    buf[:] = 0
                    assert f.read(buf, task_size=128 * 1024) == size
                    assert out.write(buf, task_size=96 * 1024 + 1) == size
                    results.append(buf.tobytes() == data)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            stop.set()

    with defaults.set({"num_threads": 4, "gds_threshold": 0}):
        thread = threading.Thread(target=worker)
        thread.start()
        sizes = [1, 5, 2, 12, 3]
        i = 0
        while not stop.is_set():
            defaults.set("num_threads", sizes[i % len(sizes)])
            i += 1
            stop.wait(0.005)
        thread.join()
    assert not errors, errors
    assert results and all(results)
    with open(out_path, "rb") as f:
        assert f.read() == data



def test_a_change_makes_new_settings_and_leaves_those_in_use_alone():
    """What a call read before a change stays as it was: set() puts a new
    object in place instead of changing the one transfers may be using
    (between the engine's check of a request and its transfer, say)."""
    before = defaults._settings
    threshold = before.gds_threshold
    with defaults.set("gds_threshold", threshold + 4096):
        assert defaults._settings is not before and defaults._settings.gds_threshold == threshold + 4096
        assert before.gds_threshold == threshold
    assert defaults._settings.gds_threshold == threshold


def test_a_set_that_fails_part_way_changes_nothing(monkeypatch):
    """The thread count is the one change the system can refuse: a set() whose
    thread count fails leaves every other setting of the call as it was."""
    old = defaults.current()

    def refused(n):
        raise RuntimeError("no threads here")

    with monkeypatch.context() as patch:
        patch.setattr(defaults._core, "set_num_threads", refused)
        with pytest.raises(RuntimeError, match="no threads"):
            defaults.set({"task_size": 8192, "gds_threshold": 7, "num_threads": 3})
    assert defaults.current() == old


def test_numpy_bools_are_bools():
    """numpy's bool is taken as Python's bool, wherever a setting takes a bool or an integer."""
    with defaults.set({"mapped_reads": np.False_, "compat_mode": np.True_}):
        assert defaults.get("mapped_reads") is False and defaults.get("compat_mode") == CompatMode.ON


def test_changes_from_two_threads_at_once_both_reach_the_engine(monkeypatch):
    """Each change copies the engine's settings and puts its copy in place: a
    change made by another thread while one is under way waits for it, rather
    than being overwritten by its copy (get() would report a value that
    transfers no longer use)."""
    real = _core.Settings
    main = threading.current_thread()
    other = threading.Thread(target=lambda: defaults.set("gds_threshold", 12345))

    def copying(*args):
        copy = real(*args)
        if args and threading.current_thread() is main and other.ident is None:
            other.start()  # the other thread's change, while this one holds its copy
            other.join(0.5)  # long enough for it to finish, unless it waits for this change
        return copy

    monkeypatch.setattr(_core, "Settings", copying)
    defaults.set("task_size", 3 * MiB)
    other.join()
    monkeypatch.undo()
    assert (defaults.get("task_size"), defaults.get("gds_threshold")) == (3 * MiB, 12345)
    assert (defaults._settings.task_size, defaults._settings.gds_threshold) == (3 * MiB, 12345)
