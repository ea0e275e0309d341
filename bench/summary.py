"""`python -m bench.summary RESULT_DIR... > part.md`: the results.md of several runs as one Markdown
document (each run's headings moved one level down, plots linked), for bench/RESULTS.md."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def section(run_dir: Path, relative_to: Path | None) -> str:
    text = (run_dir / "results.md").read_text()
    text = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M)
    plots = sorted(run_dir.glob("*.png"))
    if plots:
        base = relative_to or Path.cwd()
        links = ", ".join(f"[{p.stem}]({_relative(p, base)})" for p in plots)
        text += f"\nPlots: {links}\n"
    return text


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.summary", description=__doc__)
    p.add_argument("runs", nargs="+", type=Path, help="results directories (bench/results/<timestamp>-<scenario>)")
    p.add_argument("--relative-to", type=Path, default=None, help="plot links relative to this directory (default: the current one)")
    args = p.parse_args(argv)
    sys.stdout.write("\n".join(section(r, args.relative_to) for r in args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
