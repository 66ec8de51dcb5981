"""The limits the docs keep, checked: sizes of the front pages and the crate root docs, line
lengths, and no dates, session names or issue numbers outside docs/lab/ and CHANGELOG.md.

    python3 .ci/docs_check.py [--package-dir target/package]
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
HISTORY = re.compile(
    r"20\d\d-\d\d-\d\d|\b(?:[a-z]+-)?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|"
    r"tenth|eleventh|twelfth|[a-z]+teenth|twentieth|thirtieth|fortieth|fiftieth) session\b|\b[Ii]ssue \d+"
)
LIMITS = {"README.md": (10_240, None), "BENCHMARKS.md": (48 * 1024, 600), "RELIABILITY.md": (24 * 1024, 300)}
ROOT_DOCS_LIMIT = 15 * 1024
CRATE_LIMIT = 1 << 20


def tracked(*paths):
    out = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split()]


def main():
    problems = []
    for name, (size, lines) in LIMITS.items():
        text = (ROOT / name).read_text()
        if len(text.encode()) > size:
            problems.append(f"{name}: {len(text.encode())} bytes, at most {size}")
        if lines and text.count("\n") > lines:
            problems.append(f"{name}: {text.count(chr(10))} lines, at most {lines}")
        for i, line in enumerate(text.splitlines(), 1):
            if len(line) > 400:
                problems.append(f"{name}:{i}: a line of {len(line)} characters, at most 400")
    root_docs = sum(
        len(line.encode()) + 1 for line in (ROOT / "src/lib.rs").read_text().splitlines() if line.startswith("//!")
    )
    if root_docs > ROOT_DOCS_LIMIT:
        problems.append(f"src/lib.rs: {root_docs} bytes of crate root docs, at most {ROOT_DOCS_LIMIT}")
    for path in tracked("src", "tests", "docs", "README.md", "BENCHMARKS.md", "RELIABILITY.md", "examples"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("docs/lab/") or path.suffix in (".snap", ".gz", ".pickle", ".ptx") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            m = HISTORY.search(line)
            if m:
                problems.append(f"{rel}:{i}: `{m.group(0)}`: history belongs in docs/lab/ or CHANGELOG.md")
    if "--package-dir" in sys.argv:
        crates = list(pathlib.Path(sys.argv[sys.argv.index("--package-dir") + 1]).glob("vramscope-[0-9]*.crate"))
        if not crates:
            problems.append("no vramscope-*.crate in the package directory: run cargo package first")
        for crate in crates:
            if crate.stat().st_size > CRATE_LIMIT:
                problems.append(f"{crate}: {crate.stat().st_size} bytes, at most {CRATE_LIMIT}")
    for p in problems:
        print(p)
    print(f"docs check: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
