"""device/check.py: a step is cut at its timeout and recorded as it ends, a
failed sweep plan does not stop the others, ncu's report is read per
launch. Each on a stand-in python (no torch, no GPU)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import check  # noqa: E402

# A stand-in for PYTHON: the benchmark writes rows unless its plan is row1,
# the crash probe sleeps past any timeout.
FAKE = r"""#!/usr/bin/env python3
import json, os, sys, time
if "device/crash_probe.py" in sys.argv:
    time.sleep(30)
out = sys.argv[sys.argv.index("--json") + 1]
if os.environ.get("FLASHMLA_PERM_ROW_STAGES") == "1":
    sys.exit(3)
json.dump({"rows": [{"kind": k, "backend": "native", "device_ms_per_layer": 0.5, "x_copy_device": 1.25}
                    for k in sys.argv[sys.argv.index("--kinds") + 1].split(",")]}, open(out, "w"))
"""


def make_check(tmp_path, **env):
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    return check.Check({"PATH": os.environ["PATH"], "PYTHON": str(fake), "OUT": str(tmp_path / "out"), **env})


def test_a_failed_sweep_plan_is_recorded_and_the_next_ones_run(tmp_path):
    c = make_check(tmp_path)
    os.makedirs(c.out)
    assert not c.step("sweep")
    entry = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["steps"][-1]
    assert entry["status"] == "FAILED" and entry["note"].endswith("plans failed: row1"), entry
    plans = entry["figures"]
    assert list(plans) == [label for label, _, _ in check.SWEEP]
    assert plans["row1"]["exit_status"] == 3 and plans["row1"]["rows"] == {}
    assert plans["tile8k"]["rows"]["wo_a native"]["x_copy_device"] == 1.25


def test_a_step_past_its_timeout_is_killed_and_the_run_goes_on_within_the_budget(tmp_path):
    c = make_check(tmp_path, FLASHMLA_PERM_GPU_CHECK_TIMEOUTS="probe=1")
    os.makedirs(c.out)
    assert not c.step("probe")
    assert c.steps[-1]["status"] == "TIMEOUT" and c.steps[-1]["seconds"] < 5
    c.budget = 0  # nothing left: the next step is skipped, and counts as a failure
    assert not c.step("bench") and c.steps[-1]["status"] == "skipped"
    doc = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert not doc["ok"] and [s["status"] for s in doc["steps"]] == ["TIMEOUT", "skipped"]


def test_ncu_figures_sum_our_launches_and_weight_the_rates_by_duration(tmp_path):
    launches = {
        "1": {"duration_ns": 3000, "dram_pct_of_peak": 80.0, "instructions": 1000, "bank_conflicts": 5},
        "2": {"duration_ns": 1000, "dram_pct_of_peak": 40.0, "instructions": 3000, "bank_conflicts": 0},
    }
    names = {v: k for k, v in check.NCU_METRICS.items()}
    lines = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
    lines += [
        f'"{i}","flashmla_perm_rows","{names[m]}","","{v:,}"' for i, fig in launches.items() for m, v in fig.items()
    ]
    (tmp_path / "ncu.csv").write_text("==PROF== noise\n" + "\n".join(lines) + "\n")
    f = check.ncu_figures(str(tmp_path / "ncu.csv"), {"bytes_moved": 8000})
    assert f["launches"] == 2 and f["duration_us"] == 4.0 and f["bank_conflicts"] == 5
    assert f["dram_pct_of_peak"] == (80.0 * 3000 + 40.0 * 1000) / 4000
    assert f["instructions_per_byte"] == 4000 / 8000
