#!/usr/bin/env python3
"""Loads snapshot pickles in PyTorch's own memory viewer (MemoryViz.js) in headless Chromium
and checks that every view draws without an error; with --same, that two pickles (a PyTorch
snapshot and the same converted to vramscope's JSON and back) draw the same pages.

    python3 tools/memoryviz/check.py --memoryviz MemoryViz.js [--hovers] [--same A B]... PICKLE...

MemoryViz.js is PyTorch's `torch/utils/viz/MemoryViz.js` (the page pytorch.org/memory_viz
serves; PyTorch's wheels do not ship it), given by path: it is not part of this repository.
It imports d3 version 5 from a CDN; this script serves d3 from npm instead (installed under
`target/memoryviz/` on first use) and changes nothing else in the file. Needs `npm` and
Debian's `chromium-headless-shell` (or `chromium`); `tools/memoryviz/README.md` says how.

A view passes when the page raised no error (uncaught exceptions and rejected promises are
collected in the page) and drew something: polygons for the two timelines, segment
rectangles and one event line per trace entry for "Allocator State History", whose last
first, middle and last events are selected as a click does, which replays the trace back to
each (on load the page selects the last). Exit status 1 when any view fails or two pages
that should be the same differ.
"""

import argparse
import base64
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

VIEWS = ["Active Memory Timeline", "Allocator State History", "Active Cached Segment Timeline"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
D3_DIR = os.path.join(ROOT, "target", "memoryviz")

# The imports of MemoryViz.js, each replaced by the same names taken from the d3 bundle.
IMPORTS = {
    'import * as d3 from "https://cdn.skypack.dev/d3@5";': "const d3 = window.d3;",
    'import {axisLeft} from "https://cdn.skypack.dev/d3-axis@1";': "const {axisLeft} = window.d3;",
    'import {scaleLinear} from "https://cdn.skypack.dev/d3-scale@1";': "const {scaleLinear} = window.d3;",
    'import {zoom, zoomIdentity} from "https://cdn.skypack.dev/d3-zoom@1";': "const {zoom, zoomIdentity} = window.d3;",
    'import {brushX} from "https://cdn.skypack.dev/d3-brush@1";': "const {brushX} = window.d3;",
}

CATCH = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e.error)));
window.addEventListener('unhandledrejection', e => window.__errors.push('rejected: ' + String(e.reason)));
</script>"""

# Writes what the page shows into one element the check reads; runs at the end of the page's
# module, right after the viewer drew (synchronously) what `add_local_files` asked for.
REPORT = """
function __report() {
  const report = {errors: window.__errors};
  try {
    const shown = [...document.querySelectorAll('body > div')].filter(d => d.style.display !== 'none');
    // "Allocator State History" draws the memory as it was at the event selected: select the
    // first, middle and last events, as a click does, which replays the trace back to each.
    const drawn = [];
    for (const d of shown) {
      // The event list: the page's one monospace column of <pre> lines.
      const lines = d.querySelectorAll('div[style*="monospace"] > pre');
      for (const i of lines.length > 1 ? [0, lines.length >> 1, lines.length - 1] : []) {
        try {
          lines[i].dispatchEvent(new MouseEvent('mousedown', {bubbles: true}));
          drawn.push(d.querySelectorAll('svg rect').length);
        } catch (e) {
          window.__errors.push(`selecting event ${i}: ${e}`);
        }
      }
    }
    // With --hovers: select every event in turn and hover every block drawn, as a pointer
    // does, reading what the stack pane then says.
    const hovers = {total: 0, no_frames: 0};
    for (const d of window.__hovers ? shown : []) {
      const lines = d.querySelectorAll('div[style*="monospace"] > pre');
      const pane = d.querySelector('pre[style*="grid-column: 1 / 3"]');
      for (let i = 0; i < lines.length; i++) {
        lines[i].dispatchEvent(new MouseEvent('mousedown', {bubbles: true}));
        // The memory view's groups: segments, blocks, rounding losses.
        for (const rect of d.querySelectorAll('svg > g > g:nth-child(2) > rect')) {
          rect.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
          const text = pane.textContent;
          hovers.total += 1;
          hovers.no_frames += text.includes('This block has no frames') ||
            text.includes('<block was allocated before _record_history was enabled>');
        }
      }
    }
    report.hovers = hovers;
    const count = sel => shown.reduce((n, d) => n + d.querySelectorAll(sel).length, 0);
    // FNV-1a over what the view shows: its text and its drawing.
    let h = 0x811c9dc5;
    for (const d of shown) {
      for (const part of [d.innerText, ...[...d.querySelectorAll('svg')].map(s => s.outerHTML)]) {
        for (let i = 0; i < part.length; i++) {
          h = Math.imul(h ^ part.charCodeAt(i), 0x01000193) >>> 0;
        }
      }
    }
    Object.assign(report, {
      divs: shown.length, polygons: count('polygon'), rects: count('rect'),
      events: count('div[style*="monospace"] > pre'), drawn, digest: h.toString(16),
    });
  } catch (e) {
    window.__errors.push(`reading the page: ${e}`);
  }
  const out = document.createElement('script');
  out.type = 'application/json';
  out.id = '__report';
  out.textContent = JSON.stringify(report);
  document.body.appendChild(out);
}
__report();
"""


def chromium():
    for name in ["chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"]:
        path = shutil.which(name)
        if path:
            return path
    sys.exit("no headless Chromium: apt-get install chromium-headless-shell")


def d3_bundle():
    path = os.path.join(D3_DIR, "node_modules", "d3", "dist", "d3.min.js")
    if not os.path.exists(path):
        os.makedirs(D3_DIR, exist_ok=True)
        subprocess.run(["npm", "install", "--no-save", "--silent", "--prefix", D3_DIR, "d3@5"], check=True)
    with open(path, encoding="utf-8") as f:
        return f.read()


def viewer_module(memoryviz):
    with open(memoryviz, encoding="utf-8") as f:
        src = f.read()
    for imp, local in IMPORTS.items():
        if imp not in src:
            sys.exit(f"{memoryviz}: no line `{imp}`: not the MemoryViz.js this check knows")
        src = src.replace(imp, local)
    return src


def page(d3, module, pickle_bytes, view, hovers=False):
    files = json.dumps([{"name": "snapshot.pickle", "base64": base64.b64encode(pickle_bytes).decode()}])
    flag = "window.__hovers = true;" if hovers else ""
    call = f"\n{flag}add_local_files({files}, {json.dumps(view)});\n{REPORT}"
    module = module.replace("</script", "<\\/script")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
        + CATCH
        + f"<script>{d3}</script>"
        + f"<script type='module'>{module}{call}</script>"
        + "</body></html>"
    )


def render(browser, d3, module, pickle_path, view, work, hovers=False):
    with open(pickle_path, "rb") as f:
        data = f.read()
    doc = os.path.join(work, "page.html")
    with open(doc, "w", encoding="utf-8") as f:
        f.write(page(d3, module, data, view, hovers))
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1600,1000",
        "--virtual-time-budget=20000",
        "--dump-dom",
        "file://" + doc,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if os.environ.get("MEMORYVIZ_DEBUG"):
        sys.stderr.write(out.stderr[-3000:] + f"\n{len(out.stdout)} bytes of DOM\n")
    m = re.search(r'<script type="application/json" id="__report">(.*?)</script>\s*</body>', out.stdout, re.S)
    if not m:
        tail = (out.stderr or "").strip().splitlines()[-3:]
        return {"errors": ["the page produced no report: " + " | ".join(tail)]}
    return json.loads(html.unescape(m.group(1)))


def verdict(view, r):
    if r.get("errors"):
        return "error: " + "; ".join(r["errors"])[:300]
    if r.get("divs") != 1:
        return f"{r.get('divs')} views shown, expected 1"
    if view == "Allocator State History":
        if r["rects"] == 0 or r["events"] == 0 or len(r["drawn"]) != 3:
            return f"drew {r['rects']} rectangles and {r['events']} event lines"
    elif r["polygons"] == 0:
        return "drew no polygon"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memoryviz", required=True, help="path of PyTorch's MemoryViz.js")
    ap.add_argument("--same", nargs=2, action="append", default=[], metavar=("A", "B"),
                    help="two pickles that must draw the same pages")
    ap.add_argument("--hovers", action="store_true",
                    help="in Allocator State History, select every event and hover every block "
                    "drawn; count the hovers that say the block has no frames")
    ap.add_argument("pickles", nargs="*")
    args = ap.parse_args()
    browser, d3, module = chromium(), d3_bundle(), viewer_module(args.memoryviz)
    failed = 0
    pages = {}
    wanted = list(dict.fromkeys(args.pickles + [p for pair in args.same for p in pair]))
    with tempfile.TemporaryDirectory() as work:
        for path in wanted:
            for view in VIEWS:
                r = render(browser, d3, module, path, view, work, args.hovers)
                pages[(path, view)] = r
                bad = verdict(view, r)
                failed += bad is not None
                shape = f"{r.get('polygons', 0)} polygons, {r.get('rects', 0)} rects"
                if view == "Allocator State History":
                    shape = f"{r['events']} events; rects at first, middle, last: {r['drawn']}"
                    if args.hovers and not bad:
                        h = r["hovers"]
                        shape += f"; {h['total']} block hovers, {h['no_frames']} without frames"
                print(f"{'FAIL' if bad else 'ok  '} {os.path.basename(path):<44} {view:<31} {bad or shape}")
    for a, b in args.same:
        for view in VIEWS:
            ra, rb = pages[(a, view)], pages[(b, view)]
            same = not ra.get("errors") and not rb.get("errors") and all(
                ra.get(k) == rb.get(k) for k in ["digest", "polygons", "rects", "events", "drawn"]
            )
            if not same:
                failed += 1
                print(f"DIFF {os.path.basename(a)} / {os.path.basename(b)}: {view}")
            else:
                print(f"same {os.path.basename(a)} / {os.path.basename(b)}: {view} (digest {ra['digest']})")
    print(f"{len(pages)} pages drawn, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
