"""The application side of patching along the reasoning (issue 30): the block chosen from the
decision stage's read-out, and the report's chunk table on constructed records."""

from __future__ import annotations

import json

from goalprobe.probes.patching.results import anchor_verdicts
from goalprobe.probes.patching.sites import chunk_site

from goalprobe.report.outcomes import reasoning_chunks
from goalprobe.stages.patching import readout_peak


def lens(by_layer) -> dict:
    rows = [[{"bin": b, "value": v} for b, v in enumerate(row)] for row in by_layer]
    return {"schema": "goalprobe.demo.decision/1", "readout": {"by_layer": rows}}


def test_the_chunk_block_is_where_the_readout_peaks(tmp_path):
    path = tmp_path / "lens.json"
    # block 2 has the highest mean over progress bins (missing bins ignored), though block 1
    # has the single highest bin
    path.write_text(json.dumps(lens([[None, 0.3, 0.3], [None, 0.9, 0.1], [0.6, 0.6, None]])))
    peak = readout_peak(path, 3)
    assert peak["layer"] == 2 and peak["accuracy"][2] == 0.6
    assert "read-out peak" in peak["source"]
    # ties go to the earliest block
    path.write_text(json.dumps(lens([[0.5], [0.7], [0.7]])))
    assert readout_peak(path, 3)["layer"] == 1
    # no read-out (too few grids): the middle block, said so
    path.write_text(json.dumps({"schema": "goalprobe.demo.decision/1", "readout": None}))
    fallback = readout_peak(path, 4)
    assert fallback["layer"] == 2 and "no read-out" in fallback["source"]


def record(pair, grid, kind, site, moved):
    return {
        "pair_id": pair, "grid_id": grid, "kind": kind, "site": site, "layers": "0",
        "mode": "regenerated", "direction": "cf_to_base", "invalid": False,
        "action_changed": moved, "into_source_optimal": moved, "into_reference_optimal": moved,
        "recovered": float("nan"),
    }  # fmt: skip


def test_report_table_says_no_where_no_chunk_moves_anything():
    sites = [chunk_site(i, 2) for i in range(2)]
    records = []
    for i in range(12):
        grid = f"g{i % 6}"
        for site in sites:
            # the real patch never moves; the random grid sometimes lands in the cf's set
            records.append(record(f"p{i}", grid, "disjoint", site, False))
            records.append(record(f"p{i}", grid, "random_grid", site, i % 3 == 0))
            records.append(record(f"c{i}", grid, "control", site, False))
    verdicts = anchor_verdicts(records, layers="0", sites=sites, n_resamples=200)
    assert [v["verdict"] for v in verdicts] == ["no", "no"]
    data = {
        "reasoning_chunks": {
            "n_chunks": 2, "sites": sites, "layer_sets": {"0": [0]}, "alignment": "by fraction",
            "family": 2, "confidence": 0.975, "verdicts": verdicts,
            "peak": {"layer": 0, "source": "decision read-out peak", "accuracy": [0.5]},
        }
    }  # fmt: skip
    (block,) = reasoning_chunks(data)
    assert [row[0] for row in block.rows] == ["1 of 2", "2 of 2"]
    assert all(row[-1] == "no" for row in block.rows)
    assert "97.5%" in block.caption and "decision read-out peak" in block.caption
    assert reasoning_chunks({}) == []
