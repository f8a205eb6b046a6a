"""bench/crash_probe.py, the device check's probe of error paths: a process
that dies is reported with its native stack, and a case is judged by what it
raised, not by having run."""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import crash_probe  # noqa: E402


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
def test_a_process_that_segfaults_is_reported_with_its_native_stack(tmp_path, monkeypatch):
    # Under scripts/sanitize.sh the sanitizer runtimes are preloaded too, and
    # AddressSanitizer's own SIGSEGV handler would end the child first.
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    preload = crash_probe.build_preload(str(tmp_path))
    assert preload
    rc, _, out, err, stack = crash_probe.ended([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"], preload)
    assert rc == -11
    record = crash_probe.judge("planted", None, rc, out, err, stack)
    assert not record["ok"] and record["how"] == "died of SIGSEGV"
    assert any("_ctypes" in frame for frame in record["native_stack"]), record["native_stack"]
    assert not any("segv_backtrace:" in line for line in record["stderr_tail"])


def outcome(raised, message):
    return "CASE_OUTCOME " + ('{"raised": %s, "message": "%s"}' % (f'"{raised}"' if raised else "null", message))


@pytest.mark.parametrize("expected, raised, message, ok", [
    (("ValueError", "weight_scale has 128 rows"), "ValueError", "permute_wq_b_: weight_scale has 128 rows", True),
    (("ValueError", "weight_scale has 128 rows"), "RuntimeError", "permute_wq_b_: weight_scale has 128 rows", False),
    (("ValueError", "weight_scale has 128 rows"), "ValueError", "something else", False),
    (("ValueError", "weight_scale"), None, "", False),  # an error case that did not raise
    (None, None, "permuted", True),
    (None, "ValueError", "x", False),  # a valid case that raised
])
def test_a_case_is_judged_by_what_it_raised(expected, raised, message, ok):
    assert crash_probe.judge("c", expected, 0, outcome(raised, message), "", None)["ok"] is ok


def test_a_case_that_exits_without_saying_how_it_ended_is_not_ok():
    record = crash_probe.judge("c", None, 1, "", "Traceback ...\nImportError: no torch", None)
    assert not record["ok"] and record["how"] == "exit 1" and record["stderr_tail"][-1] == "ImportError: no torch"


def test_what_a_case_raised_is_kept_when_its_process_dies_after():
    record = crash_probe.judge("c", ("ValueError", "x"), -11, outcome("ValueError", "x"), "", None)
    assert not record["ok"] and record["how"] == "killed by signal 11" and record["raised"] == "ValueError"
