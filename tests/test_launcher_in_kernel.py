"""launch() from a real Jupyter kernel, the way a notebook cell calls it."""
import nbformat
import pytest
from nbclient import NotebookClient

CELLS = [
    "import lessonlib\n"
    "results = lessonlib.launch(lessonlib.launcher.demo_rank_sum, 4)\n"
    "print([r['sum'] for r in results])",
    "def defined_in_a_cell():\n"
    "    return 1\n"
    "try:\n"
    "    lessonlib.launch(defined_in_a_cell, 2)\n"
    "except ValueError as err:\n"
    "    print('refused:', err)",
]


@pytest.mark.timeout(180)
def test_a_notebook_cell_launches_four_ranks_and_gets_their_results():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    first, second = ("".join(o.get("text", "") for o in cell.outputs) for cell in nb.cells)
    assert first.strip() == "[6.0, 6.0, 6.0, 6.0]"
    assert "refused:" in second and "defined in the notebook" in second
