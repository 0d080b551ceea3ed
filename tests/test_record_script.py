"""scripts/record.py: one entry point for the four chapter recorders; the small files every
recorder keeps come from one function."""
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from fairlib.chapters import fidelity as fd
from fairlib.chapters import gateway_live as gl
from fairlib.chapters import token_pools_live as tl
from fairlib.records import Run

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "record.py"


@pytest.mark.parametrize("chapter, prog", [("1-4", "gateway_record"), ("5", "driftsched"),
                                           ("6", "token_pools_live"), ("8", "fidelity")])
def test_each_chapter_reaches_its_recorder(chapter, prog):
    p = subprocess.run([sys.executable, str(SCRIPT), chapter, "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: python -m fairlib.chapters.{prog} record"), p.stdout[:200]


def test_an_unknown_chapter_names_the_choices():
    p = subprocess.run([sys.executable, str(SCRIPT), "7", "vllm"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert p.returncode == 2 and "invalid choice: '7' (choose from '1-4', '5', '6', '8')" in p.stderr


def test_one_function_keeps_every_recorders_files(tmp_path):
    src = tmp_path / "run"
    src.mkdir()
    rec = {"request_id": 0, "intended_send_s": 0.123456789123, "end_s": 1.000000049}
    (src / "records.jsonl").write_text(json.dumps(rec) + "\n")
    for f in ("summary.json", "config.json", "env.json", "gateway.json"):
        (src / f).write_text("{}\n")
    (src / "gateway_events.jsonl").write_text('{"head": 1}\n')
    run = Run(None, {}, {}, path=str(src))
    dst = fd.store_run_files(run, tmp_path / "kept")
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "env.json", "gateway.json",
                                                      "gateway_events.jsonl.gz", "records.jsonl.gz", "summary.json"]
    import gzip
    got = json.loads(gzip.decompress((dst / "records.jsonl.gz").read_bytes()))
    assert got == {"request_id": 0, "intended_send_s": 0.123456789123, "end_s": 1.0}   # times to 1 us, sends exact
    (src / "gateway.json").unlink()
    with pytest.raises(FileNotFoundError, match="a run through the gateway without gateway.json"):
        gl.store_run_files(run, tmp_path / "kept2")     # chapters 1-6 keep the gateway's files, always
    assert tl.gl is gl
    assert runpy.run_path(str(SCRIPT))["RECORDERS"]["8"] == "fairlib.chapters.fidelity"
