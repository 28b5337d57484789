"""The suite's scopes run longest first, as last measured (tests/scope_order.py)."""
from types import SimpleNamespace

import scope_order


def test_scopes_run_longest_first_and_unmeasured_ones_before_all(tmp_path):
    ids = ["tests/test_a.py::test_one", "tests/test_a.py::test_two[x-y]",
           "notebooks/01.ipynb::Cell 0", "notebooks/01.ipynb::Cell 1",
           "tests/test_new.py::test_it", "tests/test_b.py::test_it", "tests/test_c.py::test_it"]
    assert scope_order.scope_of(ids[2]) == "notebooks/01.ipynb"
    items = [SimpleNamespace(nodeid=i) for i in ids]
    seconds = {"tests/test_a.py": 2.0, "notebooks/01.ipynb": 30.0, "tests/test_b.py": 5.0,
               "tests/test_c.py": 5.0}
    order = [i.nodeid for i in scope_order.ordered(items, seconds)]
    assert order == [ids[4], ids[2], ids[3], ids[5], ids[6], ids[0], ids[1]]
    recorder = scope_order.Recorder(tmp_path / "durations.json")
    for nodeid, duration in [(ids[0], 0.5), (ids[0], 1.25), (ids[2], 3.0)]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=duration))
    recorder.pytest_sessionfinish(None, 0)
    assert scope_order.load(tmp_path / "durations.json") == {"notebooks/01.ipynb": 3.0,
                                                             "tests/test_a.py": 1.8}
