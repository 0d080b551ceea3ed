"""One rule for where the data is (fairlib.paths): every reader follows FAIRLIB_DATA."""
import os
import subprocess
import sys
from pathlib import Path

from fairlib import paths

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
from fairlib import paths, traces
from fairlib.calibrate import fit
from fairlib.chapters import fidelity, grid, live, published
print(paths.data_dir())
print(published.DATA_FILE.parent, grid.GRID_FILE.parent, traces.DATA_DIR, fit.fit_data_path("vllm").parent.parent,
      fidelity.runs_root().parent)
print(published.figure("ch1.share.fcfs")["value"] if published.DATA_FILE.exists() else "missing")
"""


def _probe(env_data):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FAIRLIB_DATA", None)
    if env_data is not None:
        env["FAIRLIB_DATA"] = str(env_data)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split("\n")


def test_default_is_the_checkout_data_folder():
    assert paths.checkout() == ROOT and paths.repo_root() == ROOT and paths.data_dir() == ROOT / "data"
    lines = _probe(None)
    assert lines[0] == str(ROOT / "data")
    assert set(lines[1].split()) == {str(ROOT / "data")}   # every reader, the same folder


def test_every_reader_follows_FAIRLIB_DATA(tmp_path):
    (tmp_path / "published_figures.toml").write_text((ROOT / "data" / "published_figures.toml").read_text())
    lines = _probe(tmp_path)
    assert lines[0] == str(tmp_path.resolve())
    assert set(lines[1].split()) == {str(tmp_path.resolve())}
    assert lines[2] != "missing"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _probe(empty)[2] == "missing"


def test_an_installed_package_uses_the_user_cache(tmp_path, monkeypatch):
    """Without a checkout around the package (no pyproject.toml beside it), the engines and their
    logs go to the user's cache, the data to FAIRLIB_DATA (or a path that says where it looked)."""
    monkeypatch.setattr(paths, "PACKAGE_DIR", tmp_path / "site-packages" / "fairlib")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for v in ("FAIRLIB_DATA", "FAIRLIB_ENGINES_DIR", "FAIRLIB_ENGINES_LOG_DIR"):
        monkeypatch.delenv(v, raising=False)
    assert paths.checkout() is None and paths.repo_root() == Path.cwd()
    assert paths.engines_dir() == tmp_path / "cache" / "fairlib" / "engines"
    assert paths.engine_logs_dir() == tmp_path / "cache" / "fairlib" / "engine-logs"
    assert paths.data_dir() == tmp_path / "site-packages" / "fairlib" / "data"
    monkeypatch.setenv("FAIRLIB_DATA", str(tmp_path / "d"))
    assert paths.data_path("x.toml") == (tmp_path / "d" / "x.toml").resolve()
