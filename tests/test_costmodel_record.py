"""No readings per row: every published row's settings follow its table's own columns, and
what a table does not print takes one default for every row."""
import pytest

from dataclasses import replace

from lessonlib.costmodel.record import (SILENT, contradictions, fewest_chunks_that_fit,
                                       published_runs)

RUNS = published_runs()


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.source[:48])
def test_a_rows_settings_follow_its_tables_columns(run):
    assert run.columns, "every row names its table's columns"
    assert set(contradictions(run)) == set(run.contradicts), contradictions(run)


def test_a_table_that_contradicts_itself_is_printed_in_both_readings():
    torn = [r for r in RUNS if r.contradicts]
    assert torn, "Llama 3's 128K row prints DP 4 and 16,384 GPUs"
    for run in torn:
        others = [r for r in torn if r.columns == run.columns and r is not run]
        assert others and all(set(o.contradicts).isdisjoint(run.contradicts) for o in others)


def test_what_no_table_prints_takes_one_default_for_every_row():
    interleaved = [r for r in RUNS if r.layout.v > 1 and "Megatron-LM 2021" not in r.source
                   and "Korthikanti" not in r.source and "v" not in r.columns]
    # one rule for every row: SILENT's v, or the fewest chunks that fit where it does not
    for r in interleaved:
        assert fewest_chunks_that_fit(r.model, replace(r.layout, v=SILENT["v"]),
                                      r.cluster).v == r.layout.v, r.source
    assert SILENT["v"] in {r.layout.v for r in interleaved}
    llama = [r for r in RUNS if r.source.startswith("Llama 3")]
    assert {(r.layout.b, r.layout.recompute) for r in llama} == {(SILENT["b"],
                                                                   SILENT["recompute"])}


def test_megatron_cores_gpt_sizes_are_its_tables():
    """The weak-scaling table prints each model's size, heads, hidden size and layers; with
    a GeLU MLP of 4h and untied embeddings each shape is its printed size, within how loosely
    the table rounds (1.75B printed 1.7B, 31.5B printed 32B); tied, 1.7B would be 1.48B."""
    from lessonlib.costmodel.record import MCORE_WEAK
    runs = {r.source.rsplit(" ", 1)[-1]: r for r in RUNS if "Core weak" in r.source}
    for size, *_ in MCORE_WEAK:
        model = runs[size].model
        assert model.params() == pytest.approx(float(size[:-1]) * 1e9, rel=0.03), size
    tied = replace(runs["1.7B"].model, tied_embeddings=True)
    assert tied.params() < 0.9 * 1.7e9
