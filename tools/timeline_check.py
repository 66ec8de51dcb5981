#!/usr/bin/env python3
"""Loads timeline pictures (`vramscope timeline FILE -o timeline.svg`) in headless Chromium and
checks that each draws without an error: the SVG parses, every band is a path the browser
lays out with a non-empty box inside the plot, and every band has a title naming its site and
bytes (the hover). With --png DIR, a screenshot of each beside the check.

    python3 tools/timeline_check.py [--png DIR] TIMELINE.svg...

Needs Debian's `chromium-headless-shell` (or `chromium`). Exit status 1 when any picture
fails; one line per picture either way.
"""

import argparse
import html
import json
import os
import re
import subprocess
import sys
import tempfile

# The same search for a headless Chromium as the check of PyTorch's viewer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "memoryviz"))
from check import chromium  # noqa: E402

# Parses the SVG as the browser parses an SVG file, shows it, and reports what it drew.
PAGE = """<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>
<div id='plot'></div>
<script>
const errors = [];
window.addEventListener('error', e => errors.push(String(e.message)));
const text = %s;
const doc = new DOMParser().parseFromString(text, 'image/svg+xml');
const bad = doc.getElementsByTagName('parsererror');
const report = {errors, bands: 0, empty: [], untitled: 0, titles: []};
if (bad.length) {
  errors.push('the SVG does not parse: ' + bad[0].textContent.slice(0, 200));
} else {
  const svg = document.importNode(doc.documentElement, true);
  document.getElementById('plot').appendChild(svg);
  const plot = svg.getBoundingClientRect();
  for (const path of svg.querySelectorAll('path')) {
    report.bands += 1;
    const box = path.getBBox();
    if (!(box.width > 0) || !(box.height >= 0) || box.x < 0 || box.x + box.width > plot.width + 1) {
      report.empty.push(report.bands);
    }
    const title = path.querySelector('title') || (path.parentNode && path.parentNode.querySelector(':scope > title'));
    if (!title || !/\\d/.test(title.textContent)) report.untitled += 1;
    else report.titles.push(title.textContent.slice(0, 120));
  }
}
const out = document.createElement('script');
out.type = 'application/json';
out.id = '__report';
out.textContent = JSON.stringify(report);
document.body.appendChild(out);
</script></body></html>"""


def run(browser, url, *extra):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1100,800", *extra, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def check(browser, svg_path, work, png_dir):
    with open(svg_path, encoding="utf-8") as f:
        text = f.read()
    doc = os.path.join(work, "page.html")
    with open(doc, "w", encoding="utf-8") as f:
        f.write(PAGE % json.dumps(text).replace("</", "<\\/"))
    out = run(browser, "file://" + doc, "--dump-dom")
    m = re.search(r'<script type="application/json" id="__report">(.*?)</script>', out.stdout, re.S)
    if not m:
        tail = (out.stderr or "").strip().splitlines()[-3:]
        return {"errors": ["the page produced no report: " + " | ".join(tail)]}
    report = json.loads(html.unescape(m.group(1)))
    if png_dir:
        png = os.path.join(png_dir, os.path.splitext(os.path.basename(svg_path))[0] + ".png")
        run(browser, "file://" + os.path.abspath(svg_path), f"--screenshot={os.path.abspath(png)}")
        report["png"] = png
    return report


def verdict(r):
    if r.get("errors"):
        return "error: " + "; ".join(r["errors"])[:300]
    if r["bands"] == 0:
        return "drew no band"
    if r["empty"]:
        return f"bands {r['empty'][:5]} have an empty box or lie outside the picture"
    if r["untitled"]:
        return f"{r['untitled']} of {r['bands']} bands have no title with their bytes"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--png", metavar="DIR", help="write a screenshot of each picture in DIR")
    ap.add_argument("svgs", nargs="+")
    args = ap.parse_args()
    browser = chromium()
    if args.png:
        os.makedirs(args.png, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        for svg in args.svgs:
            r = check(browser, svg, work, args.png)
            v = verdict(r)
            size = os.path.getsize(svg)
            if v:
                failed += 1
                print(f"FAIL {svg} ({size:,} bytes): {v}")
            else:
                print(f"ok   {svg} ({size:,} bytes): {r['bands']} bands drawn, each titled; first: {r['titles'][0]!r}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
