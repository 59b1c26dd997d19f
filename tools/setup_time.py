"""The README's timing line: `make env`, `make demo` and `make test` timed one after the other
in a clean clone of HEAD, as the README tells a new user.

    .venv/bin/python tools/setup_time.py     # about 15 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

from common import REPO, machine, write_block


def timed(target: str, clone: Path) -> tuple[float, str]:
    started = time.time()
    result = subprocess.run(["make", target], cwd=clone, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"make {target} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return time.time() - started, result.stdout


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "psa-edge"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, check=True,
                                capture_output=True, text=True).stdout.strip()
        env, _ = timed("env", clone)
        demo, _ = timed("demo", clone)
        test, out = timed("test", clone)
    passed = re.search(r"(\d+) passed", out)
    block = (f"On a clean clone (commit `{commit}`, {machine()}), by "
             f"`.venv/bin/python tools/setup_time.py`: the install took {env / 60:.1f} min, "
             f"`make demo` {demo / 60:.1f} min and `make test` {test / 60:.1f} min "
             f"({passed.group(1) if passed else '?'} tests).")
    write_block("timing", block, "README.md")
    print(block)


if __name__ == "__main__":
    main()
