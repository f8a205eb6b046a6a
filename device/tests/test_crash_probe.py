"""device/crash_probe.py and its signal handler: a real SIGSEGV leaves its
record (signal, address, registers, maps) before any backtrace, and the
process still dies of the signal; a case is judged by what it raised."""

import os
import shutil
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import crash_probe  # noqa: E402

needs_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")


@pytest.fixture
def handler(tmp_path, monkeypatch):
    # Under scripts/sanitize.sh the sanitizer runtimes are preloaded too, and
    # AddressSanitizer's own SIGSEGV handler would end the child first.
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    path = crash_probe.build_handler(str(tmp_path))
    assert path
    return path


@needs_cc
@pytest.mark.parametrize("how", ["preloaded", "installed after faulthandler", "under pytest"])
def test_a_real_segfault_leaves_its_record_and_still_dies_of_the_signal(handler, how, tmp_path):
    code = "import ctypes; ctypes.string_at(1)"
    argv = [sys.executable, "-c", code]
    if how == "installed after faulthandler":  # as the probe's cases install it
        argv[-1] = "import faulthandler, crash_probe; faulthandler.enable(); crash_probe.install(); " + code
    elif how == "under pytest":  # as the device check runs the suite: -p crash_probe
        (tmp_path / "test_crash.py").write_text(f"def test_crash():\n    {code}\n")
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "crash_probe",
            str(tmp_path / "test_crash.py"),
        ]
    rc, out, err = crash_probe.ended(argv, handler)
    assert rc == -signal.SIGSEGV, err[-2000:]
    record = crash_probe.handler_record(err)
    assert record and record["signal"] == signal.SIGSEGV and record["signal_name"] == "SIGSEGV", err[-2000:]
    assert int(record["si_addr"], 16) == 1  # the address ctypes read
    assert int(record["pc"], 16) and int(record["sp"], 16)
    assert record["pc_in"] and " r-xp " in record["pc_in"], record  # pc lies in an executable mapping
    assert record["maps_lines"] > 10 and record["backtrace_ended"] and record["frames"], record
    assert err.index("crash_handler: maps") < err.index("crash_handler: backtrace")
    if how != "preloaded":  # then the handler it replaced: faulthandler's Python stack
        assert err.index("crash_handler: end") < err.index("Fatal Python error: Segmentation fault")
        assert err.count("crash_handler: signal") == 1
    judged = crash_probe.judge("planted", None, rc, out, err)
    assert not judged["ok"] and judged["signal"] == "SIGSEGV" and judged["handler"]["si_addr"] == record["si_addr"]


@needs_cc
def test_an_abort_is_recorded_with_its_signal(handler):
    rc, _, err = crash_probe.ended([sys.executable, "-c", "import os; os.abort()"], handler)
    assert rc == -signal.SIGABRT and crash_probe.handler_record(err)["signal"] == signal.SIGABRT


def outcome(raised, message):
    return "CASE_OUTCOME " + ('{"raised": %s, "message": "%s"}' % (f'"{raised}"' if raised else "null", message))


@pytest.mark.parametrize(
    "expected, rc, raised, message, ok",
    [
        (crash_probe.BAD_ROWS, 0, "ValueError", "permute_wq_b_: weight_scale has 128 rows", True),
        (crash_probe.BAD_ROWS, 0, "RuntimeError", "permute_wq_b_: weight_scale has 128 rows", False),
        (crash_probe.BAD_ROWS, 0, "ValueError", "something else", False),
        (crash_probe.BAD_ROWS, 0, None, "did not raise", False),
        (crash_probe.BAD_ROWS, -11, "ValueError", "weight_scale", False),  # raised, then died
        (crash_probe.TORCH_ERROR, 0, "RuntimeError", "shape '[-1, 3]' is invalid", True),
        (None, 0, None, "bytes as the reference's", True),
        (None, 0, "ValueError", "x", False),
        (None, 1, None, "", False),
    ],
)
def test_a_case_is_judged_by_what_it_raised_and_how_it_ended(expected, rc, raised, message, ok):
    record = crash_probe.judge("c", expected, rc, outcome(raised, message), "Traceback ...\nboom")
    assert record["ok"] is ok
    assert ok or record["stderr_tail"][-1] == "boom"


def test_the_probe_runs_a_case_on_the_cpu(tmp_path):
    """One case of the dry device check's (the check runs them all)."""
    doc = crash_probe.probe("cpu", str(tmp_path), None, ["cpu_bad_scale_rows"])
    assert [(r["case"], r["ok"], r["raised"]) for r in doc["cases"]] == [("cpu_bad_scale_rows", True, "ValueError")]
    assert doc["environment"]["uname"] and "variables" in doc["environment"]
    assert (tmp_path / "probe.json").exists()
