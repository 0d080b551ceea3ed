"""Check every page of the built book as a reader sees it: headless Chromium at 1280 px.

For each HTML page of ``_build/html`` (the pages of ``_toc.yml``) it fails when

* an element reaches past the content column (``article.bd-article``) and no ancestor inside
  the column scrolls or clips it (a wide table in a scroll container passes, one that runs off
  the page does not);
* a block of code the reader can open (a cell's input, shown or folded, or a literal block of a
  page) has a line over ``--max-line`` characters (88);
* the page's visible text holds ``say(`` or ``glue(``: a glue call the reader should not see
  (it belongs in a ``remove-input`` cell).

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: file
descriptors 3 and 4, NUL-terminated JSON), so nothing beyond the standard library and the
browser is needed. ``make check-pages`` installs Debian's ``chromium`` when it is missing.

Usage: ``python book/_scripts/check_pages.py [--html _build/html] [--width 1280]``; exit 1
with one line per finding, 0 when every page passes.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REDIRECT = re.compile(r'<meta[^>]+http-equiv="?refresh', re.I)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")

# Runs in the page; returns the findings as a list of strings.
PROBE = r"""
(() => {
  const MAX_LINE = %(max_line)d;
  const out = [], scrolls = [];
  const col = document.querySelector("article.bd-article");
  if (!col) return {out: ["no content column (article.bd-article) on the page"], scrolls};
  const c = col.getBoundingClientRect();
  const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
      (e.className && typeof e.className === "string" ? "." + e.className.trim().split(/\s+/).join(".") : "");
  const near = (e) => {
    let h = e;
    while (h && h !== col) {
      let p = h.previousElementSibling;
      while (p) { if (/^H[1-6]$/.test(p.tagName)) return p.textContent.replace("#", "").trim(); p = p.previousElementSibling; }
      h = h.parentElement;
    }
    return "";
  };
  // the nearest ancestor inside the column that does not let content overflow visibly:
  // "scroll" when it scrolls (auto/scroll) and fits the column, "cut" when it hides the rest
  const holder = (e) => {
    for (let a = e.parentElement; a && a !== col; a = a.parentElement) {
      const ox = getComputedStyle(a).overflowX;
      if (ox === "visible") continue;
      const r = a.getBoundingClientRect();
      const fits = r.left >= c.left - 1 && r.right <= c.right + 1;
      return {how: fits && (ox === "auto" || ox === "scroll") ? "scroll" : "cut", el: a};
    }
    return {how: "none", el: null};
  };
  const wide = [], held = [];
  for (const e of col.querySelectorAll("*")) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (r.right <= c.right + 1 && r.left >= c.left - 1) continue;
    if (wide.some((w) => w.contains(e))) continue;
    const h = holder(e);
    const what = `(${Math.round(r.width)} px at ${Math.round(r.left - c.left)} px, column ` +
                 `${Math.round(c.width)} px): ${name(e)} under "${near(e)}"`;
    if (h.how === "scroll") {          // one finding per scroll container
      if (!held.includes(h.el)) {
        held.push(h.el);
        scrolls.push(`scrolls (${h.el.scrollWidth} px of content in ${h.el.clientWidth} px): ` +
                     `${name(e)} under "${near(e)}"`);
      }
      continue;
    }
    wide.push(e);
    out.push((h.how === "cut" ? "cut off " : "wider than the column ") + what);
  }
  const code = col.querySelectorAll("div.cell_input pre, div.highlight pre, pre.literal-block");
  for (const p of code) {
    if (p.closest(".cell_output, .output")) continue;
    const lines = p.textContent.split("\n");
    const long = lines.filter((l) => l.length > MAX_LINE);
    if (long.length)
      out.push(`${long.length} code line(s) over ${MAX_LINE} characters under "${near(p)}": ` +
               JSON.stringify(long[0].slice(0, 60) + "..."));
  }
  const text = col.innerText;
  for (const needle of ["say(", "glue("]) {
    let i = text.indexOf(needle);
    if (i >= 0) out.push(`visible ${needle}...) text: ` + JSON.stringify(text.slice(Math.max(0, i - 30), i + 40)));
  }
  return {out, scrolls};
})()
"""


class Browser:
    """Headless Chromium on a DevTools pipe: ``call(method, params, session)`` -> result."""

    def __init__(self, exe: str, width: int, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="check-pages-")
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()

        # the browser reads commands on fd 3 and answers on fd 4: bash puts the pipes there,
        # from copies at 10 or above (so that neither end already sits on 3 or 4)
        r_hi, w_hi = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child_r, from_child_w))
        os.close(to_child_r)
        os.close(from_child_w)
        to_child_r, from_child_w = r_hi, w_hi
        redirect = f'exec "$0" "$@" 3<&{r_hi} 4>&{w_hi} {r_hi}<&- {w_hi}>&-'
        args = [exe, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen([shutil.which("bash") or "/bin/bash", "-c", redirect, *args], start_new_session=True,
                                     pass_fds=(to_child_r, from_child_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf, self._id, self.events = b"", 0, []
        self.width, self.height = width, height

    def _read(self) -> dict:
        while b"\0" not in self._buf:
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, session: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, m in enumerate(self.events):
                if m.get("method") == method and m.get("sessionId") == session:
                    del self.events[: i + 1]
                    return
            self.events.append(self._read())
        raise TimeoutError(f"no {method} within {timeout_s:.0f} s")

    def page(self) -> str:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session)
        self.call("Page.enable", {}, session)
        return session

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


def pages(html: Path) -> list[Path]:
    """The book's pages (those of _toc.yml, as built), in a stable order."""
    skip = {"genindex.html", "search.html", "py-modindex.html"}
    return sorted(p for p in html.rglob("*.html")
                  if p.name not in skip and "_static" not in p.parts and "_sources" not in p.parts
                  and "jupyter_execute" not in p.parts)


def check(html: Path, width: int, max_line: int, exe: str) -> dict[str, dict]:
    """Per page: ``{"out": [findings], "scrolls": [tables held in a scroll container]}``."""
    found: dict[str, dict] = {}
    browser = Browser(exe, width)
    try:
        session = browser.page()
        for p in pages(html):
            text = p.read_text(errors="replace")
            if REDIRECT.search(text) and "bd-article" not in text:
                found[str(p.relative_to(html))] = {"out": [], "scrolls": []}     # a redirect
                continue
            browser.call("Page.navigate", {"url": p.resolve().as_uri()}, session)
            browser.wait_event("Page.loadEventFired", session)
            res = browser.call("Runtime.evaluate", {"expression": PROBE % {"max_line": max_line},
                                                    "returnByValue": True}, session)
            if "exceptionDetails" in res:
                found[str(p.relative_to(html))] = {"out": [f"probe failed: {res['exceptionDetails']}"],
                                                   "scrolls": []}
                continue
            found[str(p.relative_to(html))] = res["result"]["value"]
    finally:
        browser.close()
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--max-line", type=int, default=88)
    ap.add_argument("--strict", default="", help="pages (comma-separated, as under --html) where "
                    "a table in a scroll container fails too: it must fit the column")
    ap.add_argument("--show-scroll", action="store_true", help="list the wide tables held in "
                    "scroll containers on the other pages")
    ap.add_argument("--browser", default=None, help="Chromium's executable (default: found on PATH)")
    a = ap.parse_args(argv)
    exe = a.browser or next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if exe is None:
        print("check-pages: no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    if not (a.html / "index.html").exists():
        print(f"check-pages: no built book at {a.html} (make book)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    found = check(a.html, a.width, a.max_line, exe)
    strict = {p.strip() for p in a.strict.split(",") if p.strip()}
    n_bad, n_scroll = 0, 0
    for page, f in found.items():
        items = f["out"] + (f["scrolls"] if page in strict else [])
        for it in items:
            print(f"{page}: {it}")
        n_bad += len(items)
        n_scroll += 0 if page in strict else len(f["scrolls"])
        if a.show_scroll and page not in strict:
            for it in f["scrolls"]:
                print(f"{page}: (allowed) {it}")
    print(f"check-pages: {len(found)} pages at {a.width} px, {n_bad} findings; {n_scroll} wide "
          f"tables held in scroll containers elsewhere (--show-scroll lists them) "
          f"({time.monotonic() - t0:.1f} s)")
    return 1 if n_bad else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
