"""The FLASHMLA_PERM_* on/off switches read by Python: one set of words
(flashmla_perm/_switches.py), in any case and with blanks around them; any
other value refused with the variable and the value named."""

import json
import os
import subprocess
import sys

import conftest
import pytest

from conftest import NATIVE
from flashmla_perm import _switches, vllm_plugin

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ON = ["1", "true", "on", "yes", "TRUE", " Yes", "On\t", "\n1 "]
OFF = ["0", "false", "off", "no", "FALSE", " 0", "No ", " oFF "]
NEITHER = ["garbage", "2", "-1", "of", "y", "n", "enable", "t rue", "0 1"]


@pytest.mark.parametrize("default", [False, True])
def test_words_in_any_case(default):
    for value in ON:
        assert _switches.parse("FLASHMLA_PERM_X", value, default) is True, value
    for value in OFF:
        assert _switches.parse("FLASHMLA_PERM_X", value, default) is False, value
    for value in (None, "", "  ", "\t"):  # unset or blank: the default
        assert _switches.parse("FLASHMLA_PERM_X", value, default) is default, value


@pytest.mark.parametrize("value", NEITHER)
def test_other_values_are_refused_by_name_and_value(value):
    with pytest.raises(ValueError) as e:
        _switches.parse("FLASHMLA_PERM_X", value, False)
    assert f"FLASHMLA_PERM_X={value!r} is not a switch value" in str(e.value)


def test_switch_reads_the_environment(monkeypatch):
    monkeypatch.setenv("FLASHMLA_PERM_X", " Off ")
    assert _switches.switch("FLASHMLA_PERM_X", True) is False
    assert _switches.switch("FLASHMLA_PERM_X", False, environ={"FLASHMLA_PERM_X": "yes"}) is True
    monkeypatch.delenv("FLASHMLA_PERM_X")
    assert _switches.switch("FLASHMLA_PERM_X", True) is True


@pytest.mark.parametrize("value", OFF)
def test_the_plugin_switch_off(monkeypatch, value):
    monkeypatch.setenv("FLASHMLA_PERM_VLLM", value)
    assert vllm_plugin._why_not() == f"FLASHMLA_PERM_VLLM={value.strip()}"


@pytest.mark.parametrize("value", ON + [""])
def test_the_plugin_switch_on(monkeypatch, value):
    monkeypatch.setenv("FLASHMLA_PERM_VLLM", value)
    why = vllm_plugin._why_not()
    assert why is None if NATIVE else why.startswith("the native module is not loaded"), why


@pytest.mark.parametrize("value", NEITHER)
def test_the_plugin_switch_refused(monkeypatch, value):
    monkeypatch.setenv("FLASHMLA_PERM_VLLM", value)
    assert f"FLASHMLA_PERM_VLLM={value!r} is not a switch value" in vllm_plugin._why_not()


def test_force_reference_at_import():
    """FLASHMLA_PERM_FORCE_REFERENCE, read once at import: on takes the
    reference path; anything neither on nor off stops the import, by name."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHMLA_PERM_")}
    code = "import json, flashmla_perm; print(json.dumps(flashmla_perm.build_info()))"
    runs = {
        v: subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=dict(env, FLASHMLA_PERM_FORCE_REFERENCE=v),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for v in (" True ", "garbage")
    }
    out = {v: (p.communicate(timeout=300)[0], p.returncode) for v, p in runs.items()}
    on, rc = out[" True "]
    assert rc == 0, on
    info = json.loads(on.strip().splitlines()[-1])
    assert info["native"] is False and info["native_error"] == "FLASHMLA_PERM_FORCE_REFERENCE=True", info
    refused, rc = out["garbage"]
    assert rc != 0 and "ValueError: FLASHMLA_PERM_FORCE_REFERENCE='garbage' is not a switch value" in refused, refused


@pytest.fixture
def expectations(monkeypatch):
    """tests/conftest.py's session start, on a CPU-only native build, with
    the FLASHMLA_PERM_EXPECT_* variables cleared."""
    for k in ("NATIVE", "CUDA", "VLLM", "COMPILER"):
        monkeypatch.delenv(f"FLASHMLA_PERM_EXPECT_{k}", raising=False)
    monkeypatch.setattr(conftest, "NATIVE", True)
    monkeypatch.setattr(conftest, "INFO", dict(conftest.INFO, native=True, cuda=False, cuda_compiler=None))
    monkeypatch.setattr(conftest, "vllm_version", lambda: None)

    def exit_code(**env):
        for k, v in env.items():
            monkeypatch.setenv(f"FLASHMLA_PERM_EXPECT_{k}", v)
        try:
            conftest.pytest_sessionstart(None)
        except pytest.exit.Exception as e:
            return e.returncode, str(e)
        return 0, ""

    return exit_code


@pytest.mark.parametrize("value", ON)
def test_the_suites_expectations_on(expectations, value):
    """An expectation switched on is enforced: no CUDA kernels, no vLLM here."""
    assert expectations(CUDA=value) == (3, f"CUDA kernels expected but not compiled in: {conftest.INFO}")
    assert expectations(CUDA="0", VLLM=value)[0] == 3


@pytest.mark.parametrize("value", OFF + ["", " "])
def test_the_suites_expectations_off(expectations, value):
    assert expectations(NATIVE=value, CUDA=value, VLLM=value) == (0, "")


@pytest.mark.parametrize("value", NEITHER)
def test_the_suites_expectations_refused(expectations, value):
    """A typo must not read as "expect nothing": the session stops (exit 4)."""
    code, said = expectations(CUDA=value)
    assert code == 4 and f"FLASHMLA_PERM_EXPECT_CUDA={value!r} is not a switch value" in said, said
