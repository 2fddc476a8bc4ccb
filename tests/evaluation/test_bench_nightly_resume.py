"""scripts/bench_nightly_false_alarms.py resumes an interrupted measurement from its --out file (issue 42 item 2:
20 runs take about 6 hours, more than one sitting), and refuses a file of other settings with one error line."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from rao_core.paths import REPO_ROOT

spec = importlib.util.spec_from_file_location("bench_fa", REPO_ROOT / "scripts/bench_nightly_false_alarms.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _args(out, runs=20, model="champion"):
    return argparse.Namespace(out=str(out), runs=runs, config="configs/cpu-smoke.yaml", campaign="smoke",
                              model=model, n_tasks=None)


def test_an_interrupted_measurement_resumes_after_its_written_runs(tmp_path):
    out = tmp_path / "fa.json"
    assert bench._done_runs(str(out), _args(out)) == []  # nothing yet
    done = [{"run": i, "false_alarm": i == 2, "wall_s": 900.0, "comparison": []} for i in (1, 2, 3)]
    bench._write(str(out), {"settings": bench._settings(_args(out)), "complete": False, "runs": done})
    assert bench._done_runs(str(out), _args(out)) == done
    assert bench._done_runs(str(out), _args(out, runs=2)) == done[:2]  # fewer runs asked: the first ones count
    assert not (tmp_path / "fa.tmp").exists()  # written through a temporary file


def test_an_out_file_of_other_settings_is_one_error_line(tmp_path):
    out = tmp_path / "fa.json"
    bench._write(str(out), {"settings": bench._settings(_args(out, model="candidate")), "runs": []})
    with pytest.raises(SystemExit) as e:
        bench._done_runs(str(out), _args(out))
    assert str(e.value).startswith(f"error: --out {out} holds runs with other settings") and "\n" not in str(e.value)
    out.write_text("{not json")
    with pytest.raises(SystemExit) as e:
        bench._done_runs(str(out), _args(out))
    assert str(e.value).startswith(f"error: --out {out}: not a JSON record of this script")
