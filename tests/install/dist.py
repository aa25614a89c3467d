"""The distributions as users install them: the sdist and the wheel built once from this checkout
(``python -m build``: the sdist, then the wheel from the sdist alone), and clean virtual
environments made from them with pip, running the README's commands as written.

    python -m tests.install.dist --out .dist      # scripts/test.sh runs this before the tests

``.dist/`` then holds the sdist, the wheel and three environments: ``harness/`` (the README's
"Conformance in your CI" pip line: no torch), ``server/`` (the README's server-from-pip lines) and
``all/`` (the same with both extras). ``lmrpc`` is on no index, so pip finds it through
``PIP_FIND_LINKS``, the folder of the wheel. Tests find the folder through ``$LMRPC_DIST``
(``harness_command()`` runs the harness-only environment's ``conformance``), or build it once.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CI_SECTION = "## Conformance in your CI"
SERVER_SECTION = "## The reference server"
ENVIRONMENTS = ("harness", "server", "all")


@dataclass(frozen=True)
class Dist:
    folder: Path

    @property
    def wheel(self) -> Path:
        return _one(self.folder, "lmrpc-*.whl")

    @property
    def sdist(self) -> Path:
        return _one(self.folder, "lmrpc-*.tar.gz")

    def venv(self, name: str) -> Path:
        return self.folder / name

    def bin(self, name: str, program: str) -> str:
        return str(self.venv(name) / "bin" / program)


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise FileNotFoundError(f"want one {pattern} in {folder}, found {[p.name for p in found]}")
    return found[0]


def bash_blocks(section: str) -> list[list[str]]:
    """The commands of each bash block under the README heading ``section``, one per line
    (continuations joined, comments dropped)."""
    text = README.read_text(encoding="utf-8")
    start = text.index(section + "\n")
    end = text.find("\n## ", start + len(section))
    blocks = re.findall(r"```bash\n(.*?)```", text[start : end if end != -1 else None], re.S)
    return [_commands(block) for block in blocks]


def bash_block(section: str, which: int = 0) -> list[str]:
    return bash_blocks(section)[which]


def _commands(block: str) -> list[str]:
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def pip_lines(section: str) -> list[str]:
    """The section's pip commands, in order, whichever block holds them."""
    return [c for block in bash_blocks(section) for c in block if c.startswith("pip ")]


def recipes() -> dict[str, list[str]]:
    """Each environment's pip commands: the README's, and for ``all`` the server's with both extras."""
    server = pip_lines(SERVER_SECTION)
    return {
        "harness": pip_lines(CI_SECTION),
        "server": server,
        "all": [c.replace('"lmrpc[server]"', '"lmrpc[server,conformance]"') for c in server],
    }


def environ_for(venv: Path, dist_folder: Path) -> dict[str, str]:
    """A shell in ``venv`` as after ``source bin/activate``, with pip finding the built wheel
    besides wherever this machine's pip configuration already looks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    links = " ".join(filter(None, (str(dist_folder), env.get("PIP_FIND_LINKS", ""))))
    return {
        **env,
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "PIP_FIND_LINKS": links,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def run_as_written(command: str, venv: Path, dist_folder: Path, cwd: Path) -> None:
    done = subprocess.run(
        shlex.split(command), cwd=cwd, env=environ_for(venv, dist_folder), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{command!r} in {venv} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def build(out: Path, say: Callable[[str], None] = print) -> Dist:
    """The sdist and wheel of this checkout, and the three environments, in ``out`` (emptied first)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], check=True, capture_output=True
    )
    say(f"sdist and wheel in {time.monotonic() - started:.0f} s")
    dist = Dist(out)

    def make(name: str, commands: list[str]) -> str:
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(dist.venv(name))], check=True)
        for command in commands:
            run_as_written(command, dist.venv(name), out, cwd=out)
        return f"{name}: {' && '.join(commands)} in {time.monotonic() - started:.0f} s"

    with ThreadPoolExecutor(len(ENVIRONMENTS)) as pool:  # pip waits on the network as much as on a core
        for line in pool.map(lambda item: make(*item), recipes().items()):
            say(line)
    return dist


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.install.dist", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / ".dist")
    args = parser.parse_args()
    build(args.out.resolve())


if __name__ == "__main__":
    main()
