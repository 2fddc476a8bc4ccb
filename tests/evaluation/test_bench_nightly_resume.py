"""scripts/bench_nightly_false_alarms.py resumes an interrupted measurement from its --out file (20
runs take about 2.5 hours, more than one sitting), refuses a file of other settings with one error line, and
summarises a partial record (what docs/pipeline/nightly.md is written from after a sitting)."""

from __future__ import annotations

import argparse
import importlib.util
from types import SimpleNamespace

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


def test_the_summary_of_a_partial_record_counts_its_runs_and_bounds_the_rate():
    row = lambda champ, cand, p: {"champion": f"{champ}/100 = {champ / 100:.3f} [0, 1]",  # noqa: E731
                                  "candidate": f"{cand}/100 = {cand / 100:.3f} [0, 1]", "p": p,
                                  "drop": round((champ - cand) / 100, 2), "status": "ok" if p > 0.05 else "FAIL"}
    runs = [{"run": 1, "false_alarm": False, "wall_s": 430.0, "comparison": [row(29, 32, 0.99)]},
            {"run": 2, "false_alarm": True, "wall_s": 417.0, "comparison": [row(37, 20, 0.01)]},
            {"run": 3, "false_alarm": False, "wall_s": 450.0, "comparison": [row(27, 30, 0.86)]}]
    entry = SimpleNamespace(n_tasks=100, difficulties=["tier1"], modes=["recursive"])
    s = bench.summarise(runs, entry, 0.1, 0.05, {"campaign": "smoke"})
    assert (s["runs"], s["false_alarms"], s["campaign"]) == (3, 1, "smoke")
    # Wilson 95% for 1/3 by hand: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), z = 1.96
    assert s["false_alarm_ci95"] == [0.061, 0.792]
    assert s["wall_s"] == {"min": 417.0, "median": 430.0, "max": 450.0}
    assert (s["evaluation_range"], s["min_p"]) == ([20, 37], 0.01)
    assert (s["drop_range"], s["all_ok"]) == ([-0.03, 0.17], False)
    # 0 alarms in n runs: Wilson's upper bound is z^2 / (n + z^2) <= 0.05 from n = 19 z^2 = 72.99, so 73 runs
    assert s["runs_for_upper_below_005"] == 73
    # the test's own rate at drop 0, champion success the mean of the six evaluations (175/600 -> 0.3)
    assert s["design_p_champion"] == 0.3 and s["false_alarm_design"] == 0.0007
    text = bench.summary_text(s)
    assert text.startswith("false alarms: 1/3 (95% CI [0.06, 0.79]); n = 100") and "20 to 37 of 100" in text
    assert "drops -0.03 to +0.17" in text and "every comparison ok: no" in text
    assert "unchanged checkpoint: 0.0007 (champion success 0.3)" in text and "takes 73 runs without an alarm" in text
    with pytest.raises(ValueError):
        bench.summarise([], entry, 0.1, 0.05, {})
