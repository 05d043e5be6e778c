"""gdscp.defaults: KvikIO's settings interface, validation and GDSCP_* variables."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

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
SIZE_SETTINGS = ["num_threads", "task_size", "bounce_buffer_size", "min_task_size"]


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
    assert defaults.task_size() == 123_456


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


def test_integer_strings_are_accepted():
    defaults.set("task_size", "65536")
    assert defaults.get("task_size") == 65536
    defaults.set("task_size", "0x2000")
    assert defaults.get("task_size") == 0x2000


@pytest.mark.parametrize("name", SIZE_SETTINGS)
@pytest.mark.parametrize("value", [0, -1, -4096, "abc", "", 1.5, None, True])
def test_invalid_sizes(name, value):
    before = defaults.get(name)
    with pytest.raises((ValueError, TypeError)) as info:
        defaults.set(name, value)
    assert name in str(info.value)
    assert defaults.get(name) == before


def test_gds_threshold_accepts_zero_but_not_negative():
    defaults.set("gds_threshold", 0)
    assert defaults.get("gds_threshold") == 0
    with pytest.raises(ValueError, match="gds_threshold"):
        defaults.set("gds_threshold", -1)
    with pytest.raises(ValueError, match="gds_threshold"):
        defaults.set("gds_threshold", "lots")


def test_bounce_buffer_size_has_a_floor():
    with pytest.raises(ValueError, match="bounce_buffer_size"):
        defaults.set("bounce_buffer_size", 100)


@pytest.mark.parametrize("value", ["maybe", "", 3, -1, 2.0, object()])
def test_invalid_compat_mode(value):
    before = defaults.get("compat_mode")
    with pytest.raises(ValueError, match="compat_mode"):
        defaults.set("compat_mode", value)
    assert defaults.get("compat_mode") == before


@pytest.mark.parametrize("value", ["perhaps", 2, -1, None])
def test_invalid_direct_io(value):
    with pytest.raises(ValueError, match="direct_io"):
        defaults.set("direct_io", value)


@pytest.mark.parametrize(
    "value, expect",
    [
        (CompatMode.ON, CompatMode.ON),
        (CompatMode.OFF, CompatMode.OFF),
        (CompatMode.AUTO, CompatMode.AUTO),
        (True, CompatMode.ON),
        (False, CompatMode.OFF),
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


@pytest.mark.parametrize("value", [1, 9, 0, "deep", None])
def test_invalid_pipeline_depth(value):
    with pytest.raises(ValueError, match="pipeline_depth"):
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


def test_set_dict_is_all_or_nothing():
    before = {name: defaults.get(name) for name in SETTINGS}
    with pytest.raises(ValueError, match="num_threads"):
        defaults.set({"task_size": 4096, "num_threads": 0})
    with pytest.raises(KeyError):
        defaults.set({"task_size": 4096, "bogus": 1})
    assert {name: defaults.get(name) for name in SETTINGS} == before


def test_set_needs_name_and_value():
    with pytest.raises(TypeError):
        defaults.set("task_size")
    with pytest.raises(TypeError):
        defaults.set()


# --------------------------------------------------------------------------
# KvikIO's older accessors
# --------------------------------------------------------------------------
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
def test_legacy_accessors(name, value):
    getter = getattr(defaults, name)
    reset = getattr(defaults, name + "_reset")
    reset(value)
    assert getter() == value
    assert defaults.get(name) == value
    if name == "num_threads":
        assert _core.num_threads() == value


def test_legacy_reset_validates():
    with pytest.raises(ValueError, match="num_threads"):
        defaults.num_threads_reset(0)
    with pytest.raises(ValueError, match="task_size"):
        defaults.task_size_reset(-5)
    with pytest.raises(ValueError, match="compat_mode"):
        defaults.compat_mode_reset("sometimes")


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


def test_environment_compat_mode_auto_and_off():
    code = "import gdscp; print(gdscp.defaults.get('compat_mode').name)"
    assert _run_with_env({"GDSCP_COMPAT_MODE": "OFF"}, code).stdout.strip() == "OFF"
    assert _run_with_env({"GDSCP_COMPAT_MODE": "auto"}, code).stdout.strip() == "AUTO"


@pytest.mark.parametrize(
    "variable, value",
    [
        ("GDSCP_NUM_THREADS", "0"),
        ("GDSCP_TASK_SIZE", "big"),
        ("GDSCP_GDS_THRESHOLD", "-1"),
        ("GDSCP_COMPAT_MODE", "sometimes"),
        ("GDSCP_BOUNCE_BUFFER_SIZE", "-4096"),
        ("GDSCP_DIRECT_IO", "sideways"),
    ],
)
def test_bad_environment_value_names_the_variable(variable, value):
    result = _run_with_env({variable: value}, "import gdscp")
    assert result.returncode != 0
    assert "ValueError" in result.stderr
    assert variable in result.stderr
    assert value in result.stderr


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

