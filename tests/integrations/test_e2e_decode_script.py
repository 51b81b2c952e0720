"""bench/e2e_decode.py --dry-run: every variant and mode on a tiny CPU model, through the worker
process, writes its table and JSON, and the patched model's check against plain passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "e2e_decode.py"


def test_dry_run_writes_the_table(tmp_path):
    out = tmp_path / "e2e"
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--batches", "1,3", "--out", str(out)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = (out / "results.md").read_text()
    assert table in result.stdout
    assert "| variant | mode | batch 1 tok/s | vs plain | batch 3 tok/s | vs plain | check vs plain |" in table
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")}
    assert set(rows) == {(v, m) for v in ("plain", "opforge", "liger") for m in ("eager", "compiled")}
    for mode in ("eager", "compiled"):
        assert "reference" in rows[("plain", mode)]
        assert "ok b1:" in rows[("opforge", mode)] and "ok b3:" in rows[("opforge", mode)]
        assert "WARN" not in rows[("opforge", mode)]
    assert "not installed" in rows[("liger", "eager")] or "needs CUDA" in rows[("liger", "eager")]

    report = json.loads((out / "results.json").read_text())
    assert report["meta"]["transformers"] and report["meta"]["commit"]
    runs = {(r["variant"], r["mode"]): r for r in report["results"]}
    for variant in ("plain", "opforge"):
        for mode in ("eager", "compiled"):
            for batch in ("1", "3"):
                res = runs[(variant, mode)]["batches"][batch]
                assert res["status"] == "ok" and res["tokens_per_s"] > 0, res
                assert len(res["runs_tokens_per_s"]) == report["settings"]["repeats"]
    for batch in ("1", "3"):
        check = runs[("opforge", "eager")]["check"][batch]
        assert check["ok"] and 0 <= check["max_rel_diff"] <= report["settings"]["tolerance"]


def test_bad_arguments_are_refused():
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--variants", "plain,vllm"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--variants" in result.stderr and "plain, opforge, liger" in result.stderr
