"""``labs/sweep.py --published RUN``: the cost model's predicted sweep around a published
run's layout, the run's own point equal to the published record's prediction; bad settings
refused in one line. Pure arithmetic: no rank starts."""
import json
import sys
from pathlib import Path

import pytest

from lessonlib.costmodel.published import published_rows

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "labs"))   # after site-packages: labs/ holds scripts, not a package
import sweep  # noqa: E402  (labs/ is not a package)


def test_a_published_runs_sweep_holds_its_own_point(tmp_path):
    out = tmp_path / "sweep"
    assert sweep.main(["--published", "Llama 3 Table 4, 128K", "--grid", "c=8,16",
                       "--out", str(out), "--plot"]) == 0
    rows = json.loads((out / "table.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok"] and (out / "plot.png").exists()
    own = next(r for r in rows if r["c"] == "16")
    published = next(r for r in published_rows() if r.run.source == "Llama 3 Table 4, 128K")
    assert own["tokens_per_s_per_gpu"] == pytest.approx(published.estimate.tokens_per_s
                                                        / published.run.n_gpus)
    assert "d=8" in next(r for r in rows if r["c"] == "8")["layout"]     # the GPUs kept


@pytest.mark.parametrize("argv, words", [
    (["--published", "nope", "--grid", "c=1"], "--published 'nope' names no published run"),
    (["--published", "Llama", "--grid", "zz=1"], "--grid/--set zz: not a field"),
    (["--published", "Llama"], "needs one or more --grid"),
])
def test_bad_settings_are_refused_in_one_line(tmp_path, capsys, argv, words):
    with pytest.raises(SystemExit) as done:
        sweep.main([*argv, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1 and words in err[0], err
