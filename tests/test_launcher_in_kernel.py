"""launch() from a real Jupyter kernel, the way a notebook cell calls it: warm launches, a
function written in a cell, an edited worker module, and nothing left when the kernel ends."""

import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

CELLS = [
    "import lessonlib\n"
    "results = lessonlib.launch(lessonlib.launcher.demo_rank_sum, 4)\n"
    "print([r.sum for r in results])",
    # A function written in a cell, with a global of the notebook, on 4 ranks.
    "import torch, torch.distributed as dist\n"
    "from lessonlib import comm\n"
    "BASE = 10.0\n"
    "def defined_in_a_cell():\n"
    "    x = torch.tensor([BASE + dist.get_rank()])\n"
    "    comm.all_reduce(x)\n"
    "    return x.item()\n"
    "print('cell:', lessonlib.launch(defined_in_a_cell, 4))",
    # A worker module next to the notebook, edited between two launches.
    "import sys, pathlib\n"
    "sys.path.insert(0, {folder!r})\n"
    "module = pathlib.Path({folder!r}) / 'my_worker.py'\n"
    "module.write_text('def work():\\n    return \"first\"\\n')\n"
    "import my_worker\n"
    "before = lessonlib.launch(my_worker.work, 2)\n"
    "module.write_text('def work():\\n    return \"edited since\"\\n')\n"
    "print('edited:', before, lessonlib.launch(my_worker.work, 2))",
    "import os, psutil\n"
    "server = lessonlib.launcher.server_pid()\n"
    "others = [p.pid for p in psutil.Process().children(recursive=True)\n"
    "          if p.pid != server and 'resource_tracker' not in ' '.join(p.cmdline())]\n"
    "print('server:', server, 'others:', others)",
]


@pytest.mark.timeout(240)
def test_a_notebook_cell_launches_four_ranks_and_gets_their_results(tmp_path, monkeypatch):
    cells = [c.replace("{folder!r}", repr(str(tmp_path))) for c in CELLS]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    temp = tempfile.mkdtemp(prefix="kt-")        # the kernel's temp folder: short, its own
    monkeypatch.setenv("TMPDIR", temp)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    first, cell, edited, left = ("".join(o.get("text", "") for o in c.outputs) for c in nb.cells)
    assert first.strip() == "[6.0, 6.0, 6.0, 6.0]"
    assert cell.strip() == "cell: [46.0, 46.0, 46.0, 46.0]"
    assert edited.strip() == "edited: ['first', 'first'] ['edited since', 'edited since']"
    server = int(left.split()[1])
    assert left.strip().endswith("others: []"), left
    # The kernel has shut down: its fork server goes with it.
    try:
        _, alive = psutil.wait_procs([psutil.Process(server)], timeout=10)
    except psutil.NoSuchProcess:
        alive = []
    assert not alive, f"the fork server {server} outlived its kernel"
    deadline = time.monotonic() + 5       # and so do its launch and server folders
    while time.monotonic() < deadline and _ours(temp):
        time.sleep(0.1)
    assert not _ours(temp), f"left in the temp folder after the kernel ended: {_ours(temp)}"
    shutil.rmtree(temp, ignore_errors=True)


def _ours(folder) -> list[str]:
    return [p.name for p in Path(folder).iterdir()
            if p.name.startswith(("lessonlib-", "torchinductor_"))]
