"""Does a change to the native kernels cost this host anything? Run it on every host kind you have.

    python bench/kernel_guard.py [--base REF] [--weights dense,q4_1,int8] [--kernels avx512,avx2]
                                 [--rounds 3] [--tolerance 0.05] [--force] [--json out.json]

A kernel tuned on one host can cost another a third of its step: weights requested 8 KB ahead won
a fifth on an Intel Xeon and lost a third on AMD Zen 4, and nothing noticed, because each benchmark
ran on whichever host was at hand. So a change to the files the native decode step's speed depends
on (``KERNEL_PATHS``) is timed against the tree it changes, on the host this runs on:

- the base is REF's tree (default: the merge base with ``main``; on ``main`` itself, ``HEAD``'s
  parent), exported with ``git archive``; the change is this working tree, uncommitted edits
  included. When no kernel file differs, nothing runs (``--force`` runs anyway);
- per instruction set of the kernels (default: each one this host runs, so an AVX-512 host guards
  the avx2 build too) and weight format, ``bench/decode_step.py --kernels ISA --threads 1 --trees
  BASE,CHANGE``: alternating, a fresh process each, medians over ``--rounds`` (a base that has no
  such instruction set is not measured: its row says so);
- each step time also as a fraction of this host's memory-bound limit at one thread (a one-stream
  step reads every weight once: ``bench/bandwidth.py``'s bandwidth over the bytes read per token).

It prints the host (CPU model, family and model number, one core's read bandwidth) and one row per
instruction set and format, the rows of docs/performance.md's per-host table, and exits 1 when the
change is slower than the base by more than ``--tolerance`` in any of them (say so in the commit
when you accept it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from anchors import lmrpc_weight_bytes
from bandwidth import read_bandwidth_gbps

from reference_server.cpu import cpu_id
from reference_server.engine.native.kernels import ISAS, best_isa, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
KERNEL_PATHS = (  # what a native decode step's speed depends on
    "reference_server/engine/native/",
    "reference_server/cpu.py",
    "reference_server/engine/kv_pool.py",
    "reference_server/models/packed_linear.py",
    "reference_server/models/quantized.py",
    "reference_server/models/gguf_weights.py",
)
FORMATS = ("dense", "q4_1", "int8")


@dataclass(frozen=True, slots=True)
class Row:
    kernels: str
    weights: str
    base_ms: float
    change_ms: float
    base_of_limit: float  # the step's fraction of the memory-bound limit
    change_of_limit: float

    @property
    def ratio(self) -> float:
        return self.change_ms / self.base_ms


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def default_base() -> str:
    """The merge base with main; HEAD's parent on main itself, or where no branch is called main."""
    head = git("rev-parse", "HEAD")
    try:
        base = git("merge-base", "HEAD", "main")
    except subprocess.CalledProcessError:
        base = head
    return git("rev-parse", "HEAD~1") if base == head else base


def kernel_files_changed(base: str) -> list[str]:
    """Files under KERNEL_PATHS that differ between ``base`` and the working tree."""
    changed = git("diff", "--name-only", base, "--", *KERNEL_PATHS)
    untracked = git("ls-files", "--others", "--exclude-standard", "--", *KERNEL_PATHS)
    return sorted({*changed.splitlines(), *untracked.splitlines()} - {""})


def export_tree(ref: str, into: Path) -> Path:
    archive = into / "base.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, stdout=out)
    tree = into / "base"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def step_ms(base: Path, kernels: str, weights: str, rounds: int, into: Path) -> tuple[float, float]:
    """Median native decode step in ms of (base, change) at one thread, side by side; the base's is
    nan when its tree has no such kernels."""
    report = into / f"{kernels}-{weights}.json"
    # the best ISA is what "native" runs, in trees from before the ISAs had names too
    option = "native" if kernels == best_isa() else kernels

    def measure(trees: list[Path]) -> dict[str, dict[str, float]]:
        subprocess.run(
            [
                sys.executable, str(ROOT / "bench" / "decode_step.py"), "--kernels", option, "--threads", "1",
                "--weights", weights, "--rounds", str(rounds), "--trees", ",".join(map(str, trees)),
                "--json", str(report),
            ],
            cwd=ROOT, check=True,
        )  # fmt: skip
        return json.loads(report.read_text())["trees"]

    try:
        trees = measure([base, ROOT])
    except subprocess.CalledProcessError:
        print(f"the base has no {kernels} kernels: the change alone")
        return float("nan"), measure([ROOT])[str(ROOT)]["step"]
    return trees[str(base)]["step"], trees[str(ROOT)]["step"]


def of_limit(step: float, weight_bytes: int, gbps: float) -> float:
    """The step's fraction of the memory-bound limit: the time to read the weights once, over the step."""
    return weight_bytes / (gbps * 1e9) * 1000 / step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", help="the tree the change is measured against (a git ref)")
    parser.add_argument("--weights", default=",".join(FORMATS), help=f"formats, of {', '.join(FORMATS)}")
    here = [isa for isa in ISAS if unavailable_reason(isa) is None]
    parser.add_argument(
        "--kernels",
        default=",".join(here),
        help=f"instruction sets, of {', '.join(ISAS)} (default: this host's)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.05, help="slower than this fraction fails")
    parser.add_argument("--force", action="store_true", help="measure even when no kernel file changed")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    formats = args.weights.split(",")
    unknown = set(formats) - set(FORMATS)
    if unknown:
        parser.error(f"--weights: unknown format(s) {sorted(unknown)}; known: {', '.join(FORMATS)}")
    isas = [isa for isa in args.kernels.split(",") if isa]
    if not isas or set(isas) - set(ISAS):
        parser.error(
            f"--kernels: {args.kernels!r}, want instruction sets of {', '.join(ISAS)} this host runs"
        )
    base = args.base or default_base()
    changed = kernel_files_changed(base)
    if not changed and not args.force:
        print(f"no kernel file differs from {base[:12]} ({', '.join(KERNEL_PATHS)}): nothing to measure")
        return
    print(f"kernel files changed since {base[:12]}: {', '.join(changed) or '(none; --force)'}")
    gbps = read_bandwidth_gbps(1)
    print(f"host: {cpu_id()}, one core reads {gbps:.1f} GB/s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lmrpc-kernel-guard-") as scratch:
        tree = export_tree(base, Path(scratch))
        for isa in isas:
            for weights in formats:
                before, after = step_ms(tree, isa, weights, args.rounds, Path(scratch))
                size = lmrpc_weight_bytes(["--weights", weights])
                rows.append(
                    Row(
                        isa, weights, before, after, of_limit(before, size, gbps), of_limit(after, size, gbps)
                    )
                )
    print(
        f"\n| host | kernels | weights | base {base[:12]}, ms | change, ms | change / base "
        "| of the limit (base, change) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {cpu_id().name} | {r.kernels} | {r.weights} | {r.base_ms:.2f} | {r.change_ms:.2f} | {r.ratio:.3f} "
            f"| {r.base_of_limit:.0%}, {r.change_of_limit:.0%} |"
        )
    if args.json:
        host = {"cpu": str(cpu_id()), "read_gbps_1_thread": gbps, "base": base, "changed": changed}
        args.json.write_text(json.dumps({"host": host, "rows": [asdict(r) for r in rows]}, indent=2))
    slower = [r for r in rows if r.ratio > 1 + args.tolerance]
    if slower:
        worst = ", ".join(f"{r.kernels} {r.weights} {r.ratio:.2f}x" for r in slower)
        print(f"\nslower than {base[:12]} by more than {args.tolerance:.0%} on this host: {worst}")
        sys.exit(1)


if __name__ == "__main__":
    main()
