"""book/_scripts/check_pages.py on small pages made here: each finding it must report, and a page
that passes (headless Chromium; skipped where none is installed: `make chromium`)."""
import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_pages", ROOT / "book" / "_scripts" / "check_pages.py")
cp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cp)
EXE = next((shutil.which(b) for b in cp.BROWSERS if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(EXE is None, reason="no Chromium (apt-get install chromium)")

PAGE = """<!doctype html><html><head><style>body {{ margin: 0 }}
article.bd-article {{ width: 700px; margin-left: 100px }} .scroll {{ overflow-x: auto }}</style></head>
<body><article class="bd-article"><h1>Title</h1>{body}</article></body></html>"""


def _site(tmp_path, pages):
    (tmp_path / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=a.html" />')
    for name, body in pages.items():
        (tmp_path / name).write_text(PAGE.format(body=body))
    return tmp_path


def test_each_finding_is_reported(tmp_path):
    html = _site(tmp_path, {
        "ok.html": '<p>fits</p><div class="scroll"><table style="width: 900px"><tr><td>x</td></tr></table></div>',
        "wide.html": '<h2>Tables</h2><table style="width: 900px"><tr><td>x</td></tr></table>',
        "code.html": '<div class="cell_input"><pre>' + "x" * 89 + "</pre></div>",
        "glue.html": "<p>say(&quot;key&quot;, 1)</p><details><summary>code</summary>glue(k)</details>",
    })
    found = cp.check(html, 1280, 88, EXE)
    assert found["index.html"] == {"out": [], "scrolls": []}          # a redirect is no page
    assert found["ok.html"]["out"] == [] and len(found["ok.html"]["scrolls"]) == 1
    assert len(found["wide.html"]["out"]) == 1
    assert found["wide.html"]["out"][0].startswith("wider than the column") and '"Tables"' in found["wide.html"]["out"][0]
    assert found["code.html"]["out"] == ['1 code line(s) over 88 characters under "Title": "' + "x" * 60 + '..."']
    glue = found["glue.html"]["out"]
    assert len(glue) == 1 and glue[0].startswith("visible say(")       # the folded glue( is not visible


def test_main_fails_on_a_scrolling_table_only_where_strict(tmp_path, capsys):
    html = _site(tmp_path, {"a.html": '<div class="scroll"><table style="width: 900px"><tr><td>x</td></tr>'
                                      '</table></div>'})
    assert cp.main(["--html", str(html), "--browser", EXE]) == 0
    assert cp.main(["--html", str(html), "--browser", EXE, "--strict", "a.html"]) == 1
    assert "a.html: scrolls" in capsys.readouterr().out
