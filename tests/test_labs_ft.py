"""labs/ft.py: a planted hang named and a slowed rank named, end to end through the lab's
command line, in the shared result shape; bad settings of every run (the torchft ones
included, which are too slow to run here: tests/test_faults_replicas.py and
test_faults_diloco.py run them) stop it with one line before any process starts, without
importing torchft."""
import sys
from functools import partial

import labrun
import pytest

_run = partial(labrun.run, "ft")


@pytest.mark.timeout(60)
def test_a_skipped_collective_is_named_from_the_dumps(tmp_path, no_children_left):
    record = labrun.run_lab("ft", "--what", "hangs", "--plant", "skipped", "--world-size", "2",
                            "--timeout", "2", tmp_path=tmp_path)
    labrun.check_shape(record, "ft", 2)
    assert record["rows"] == [{"plant": "skipped", "hung": True, "kind": "skipped",
                               "op": "all_reduce", "group": "1", "missing": [1]}]


@pytest.mark.timeout(60)
def test_the_slowed_rank_is_named(tmp_path, no_children_left):
    record = labrun.run_lab("ft", "--what", "straggler", "--world-size", "2", "--steps", "3",
                            "--slow-rank", "0", "--device-s", "0.03", tmp_path=tmp_path)
    labrun.check_shape(record, "ft", 2)
    found = record["results"]["lessonlib"]
    assert found["named"] == [0] and found["named_exactly_the_slowed"]
    assert [(r["rank"], r["slowed"], r["named"]) for r in record["rows"]] == \
        [(0, True, True), (1, False, False)]
    assert found["predicted_throughput_lost"] > 0


@pytest.mark.parametrize("flags,words", [
    (("--what", "hangs", "--world-size", "1"), "--world-size 1: --what hangs needs at least 2"),
    (("--what", "hangs", "--steps", "5"), "--steps 5: the planted hangs run 3 steps"),
    (("--what", "hangs", "--timeout", "0"), "--timeout must be a positive number of seconds"),
    (("--what", "straggler", "--slow-rank", "4"), "--slow-rank 4 is not a rank of --world-size 4"),
    (("--what", "straggler", "--slowdown", "0.5"), "--slowdown must be a finite number >= 1"),
    (("--what", "replica", "--world-size", "2"), "needs at least 3 ranks (two must survive"),
    (("--what", "replica", "--kill-at", "6"), "--kill-at 6 must be between 1 and --steps 6 - 1"),
    (("--what", "replica", "--kill", "3"), "--kill 3 is not a replica of --world-size 3"),
    (("--what", "replica", "--dtype", "bf16"), "--what replica computes in float64"),
    (("--what", "diloco", "--sync-every", "3"), "--steps 8 must be a multiple of --sync-every 3"),
    (("--what", "diloco", "--fragments", "3"),
     "--sync-every 4 must be a multiple of --fragments 3"),
    (("--what", "diloco", "--json", "."), "--json . is a folder"),
])
def test_bad_settings_get_one_line(flags, words):
    done = _run(*flags)
    assert done.returncode == 2 and words in done.stderr.strip().splitlines()[-1], done.stderr


def test_without_torchft_the_lab_imports_and_refuses(monkeypatch):
    """tests/test_gpu_check.py imports every lab where torchft may be missing."""
    monkeypatch.setitem(sys.modules, "torchft", None)         # import torchft: ImportError
    labrun.load_lab("ft")
    done = _run("--what", "diloco", "--steps", "6")
    assert done.returncode == 2 and "--steps 6 must be a multiple" in done.stderr
