"""Mutants nobody chose: an AST mutator over the reference server's request path, each mutant judged by
the conformance harness (``--level all``) against the fake engine.

    python bench/mutation.py run [--minutes 9] [--only PATTERN]   # a chunk; resumes where it stopped
    python bench/mutation.py run --sample 150 --seed 13           # a chunk of a stratified sample
    python bench/mutation.py report [--sample 150 --seed 13]      # score, survivors, equivalents
    python bench/mutation.py show ID                              # one mutant's diff

Every mutant changes one operator, constant, condition, return value or call statement in one file
of the request path (frontend validation, request table, streaming assembly, abort handling,
detokenizer and stop matching, the stopping rules). It is served by a reference server started from
a copy of ``reference_server/`` holding the mutated file (the harness itself is never mutated); the
harness's verdict is the mutant's: any failure, error or hang kills it. Authentication is on (a
client and an admin token), so the ownership rules of AUTH-3 are exercised too. Results are appended to
``reports/mutation/results.jsonl``, so a long run is made of short chunks (``--minutes``) that can be
interleaved with other work. A survivor is either killed by a new or sharper case, or listed with a
one-line reason why it is equivalent in ``bench/mutation-equivalent.txt``.

All mutants take hours of one core. ``--sample N --seed S`` judges a deterministic sample instead:
N mutants split over the files in proportion to each file's count (largest remainders first), each
file's share drawn by a generator seeded with S and the file's path, so the same N and S name the
same mutants on every machine; ``report`` with the same N and S scores exactly that sample.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "reports" / "mutation" / "results.jsonl"
EQUIVALENT = ROOT / "bench" / "mutation-equivalent.txt"
KNOWN_FAILURES = ROOT / "tests" / "selftest" / "reference-known-failures.toml"
TARGETS = (  # the request path, in the order a Generate crosses it
    "reference_server/frontend/validation.py",
    "reference_server/frontend/requests.py",
    "reference_server/frontend/inference.py",
    "reference_server/frontend/streaming.py",
    "reference_server/frontend/control.py",
    "reference_server/detokenizer/state.py",
    "reference_server/detokenizer/stops.py",
    "reference_server/detokenizer/incremental.py",
    "reference_server/engine/stopping.py",
)
SERVER_ARGS = (  # the self-test's lane (tests/selftest/lanes.py), with a stall timeout short enough that
    # FLOW-2 runs at TIME_SCALE (the default 30 s skips it, and with it RequestState.fail) and long enough
    # that FLOW-1 still shows its bound first
    "--engine", "fake", "--fake-token-delay", "0.002", "--kv-tokens", "100000", "--max-waiting-requests", "64",
    "--stall-timeout", "6",
)  # fmt: skip
# Authentication on, as a deployment with tenants runs: without it every caller is an admin and the
# ownership rules (AUTH-3: a client's Abort reaches only its own requests) are never exercised.
CLIENT_TOKEN, ADMIN_TOKEN = "mutation-client-token", "mutation-admin-token"
TOKENS_FILE = f"{CLIENT_TOKEN} client\n{ADMIN_TOKEN} admin\n"
TIME_SCALE = "0.5"
MUTANT_TIMEOUT_S = 240.0  # a harness run past this is a hang: the mutant is killed


@dataclass(frozen=True, slots=True)
class Mutant:
    id: str  # file:line:col:operator[#k], stable while the file does not change
    file: str
    line: int
    operator: str
    before: str
    after: str


# ── generating mutants ───────────────────────────────────────────────────────────────────────

_COMPARE_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}  # fmt: skip
_BINOP_SWAP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv,
}  # fmt: skip
Rewrite = Callable[[ast.AST], ast.AST | None]  # a node -> its mutated copy (None: not applicable)


def _compare(node: ast.AST) -> ast.AST | None:
    if not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return None
    swap = _COMPARE_SWAP.get(type(node.ops[0]))
    return ast.Compare(node.left, [swap()], node.comparators) if swap else None


def _boolop(node: ast.AST) -> ast.AST | None:
    if not isinstance(node, ast.BoolOp):
        return None
    return ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)


def _not(node: ast.AST) -> ast.AST | None:
    return node.operand if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) else None


def _binop(node: ast.AST) -> ast.AST | None:
    if not isinstance(node, ast.BinOp) or _is_string(node):
        return None
    swap = _BINOP_SWAP.get(type(node.op))
    return ast.BinOp(node.left, swap(), node.right) if swap else None


def _number(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return ast.Constant(node.value + 1)
    return None


def _boolean(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        return ast.Constant(not node.value)
    return None


def _condition(node: ast.AST) -> ast.AST | None:
    """The condition of an ``if``/``while`` (or a conditional expression), negated."""
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        return ast.UnaryOp(ast.Not(), node.test)
    return None


def _return(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Return) and node.value is not None and not _is_none(node.value):
        return ast.Return(ast.Constant(None))
    return None


def _statement(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.AugAssign) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return ast.Pass()
    return None


OPERATORS: dict[str, Rewrite] = {
    "compare": _compare,
    "boolop": _boolop,
    "drop-not": _not,
    "binop": _binop,
    "number+1": _number,
    "bool-flip": _boolean,
    "negate-if": _condition,
    "return-none": _return,
    "drop-statement": _statement,
}


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_string(node: ast.BinOp) -> bool:
    return any(isinstance(side, (ast.JoinedStr, ast.Constant)) and isinstance(getattr(side, "value", ""), str)
               for side in (node.left, node.right))  # fmt: skip


# Code the reference server never runs for its model (SmolLM2's tokenizer is byte-level BPE).
UNREACHABLE = {"WindowDecoder": "serves tokenizers that are not byte-level"}


def _skipped(tree: ast.Module) -> set[int]:
    """Nodes no mutant touches: annotations, docstrings, logging calls, f-string messages, and the
    classes in UNREACHABLE."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in UNREACHABLE:
            mark(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                mark(arg.annotation)
        if isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                mark(first)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
        ):
            if node.func.value.id == "log":
                mark(node)
        if isinstance(node, ast.JoinedStr):
            mark(node)
    return skip


def mutants_of(path: str) -> Iterator[tuple[Mutant, str]]:
    """Every mutant of one file, with the file's mutated source."""
    source = (ROOT / path).read_text(encoding="utf-8")
    tree = ast.parse(source)
    skip = _skipped(tree)
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    seen: dict[str, int] = {}
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        for name, rewrite in OPERATORS.items():
            mutated = rewrite(node)
            if mutated is None:
                continue
            target = node.test if name == "negate-if" else node  # type: ignore[attr-defined]
            start = offsets[target.lineno - 1] + target.col_offset
            end = offsets[target.end_lineno - 1] + target.end_col_offset
            before = source[start:end]
            after = f"not ({before})" if name == "negate-if" else _render(mutated)
            if after == before:
                continue
            key = f"{path}:{node.lineno}:{node.col_offset}:{name}"  # type: ignore[attr-defined]
            seen[key] = seen.get(key, 0) + 1
            mutant_id = key if seen[key] == 1 else f"{key}#{seen[key]}"
            first_line = before.splitlines()[0] if before else ""
            yield (
                Mutant(mutant_id, path, node.lineno, name, first_line.strip(), after.splitlines()[0].strip()),  # type: ignore[attr-defined]
                source[:start] + after + source[end:],
            )


def _render(mutated: ast.AST) -> str:
    """Source for the mutated node, written where the original stood."""
    if isinstance(mutated, ast.Pass):
        return "pass"
    if isinstance(mutated, ast.Return):
        return "return None"
    text = ast.unparse(mutated)
    return f"({text})" if isinstance(mutated, (ast.Compare, ast.BoolOp, ast.BinOp)) else text


def all_mutants(only: str = "*") -> list[tuple[Mutant, str]]:
    return [(m, src) for path in TARGETS for m, src in mutants_of(path) if fnmatch.fnmatch(m.id, only)]


def sample(mutants: list[tuple[Mutant, str]], size: int | None, seed: int) -> list[tuple[Mutant, str]]:
    """A stratified sample of ``size`` mutants (all of them when ``size`` is None or not smaller), in
    judging order: each file's mutants shuffled by a generator seeded with ``seed`` and the file's path,
    its share the head of that order, the files taken in turn. A smaller sample is the head of a larger
    one's files, so the judged head of a sample is itself (close to) a smaller stratified sample."""
    by_file: dict[str, list[tuple[Mutant, str]]] = {}
    for item in mutants:
        by_file.setdefault(item[0].file, []).append(item)
    for path, items in by_file.items():
        items.sort(key=lambda item: item[0].id)
        random.Random(f"{seed}:{path}").shuffle(items)
    total = len(mutants)
    size = total if size is None else min(size, total)
    exact = {path: size * len(items) / total for path, items in by_file.items()}
    shares = {path: int(share) for path, share in exact.items()}
    by_remainder = sorted(exact, key=lambda path: (shares[path] - exact[path], path))
    for path in by_remainder[: size - sum(shares.values())]:
        shares[path] += 1
    heads = [by_file[path][: shares[path]] for path in by_file]
    return [item for turn in itertools.zip_longest(*heads) for item in turn if item is not None]


# ── judging one mutant ───────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Verdict:
    id: str
    killed: bool
    how: str  # "failed: CASE, ...", "server did not start", "hung", "survived"
    seconds: float
    harness_exit: int | None


def judge(mutant: Mutant, source: str, scratch: Path) -> Verdict:
    started = time.monotonic()
    overlay = scratch / "overlay"
    if overlay.exists():
        shutil.rmtree(overlay)
    shutil.copytree(
        ROOT / "reference_server", overlay / "reference_server", ignore=shutil.ignore_patterns("__pycache__")
    )
    (overlay / mutant.file).write_text(source, encoding="utf-8")
    # the mutated server first, then this tree's harness (not whichever tree an editable install names)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(overlay), str(ROOT))),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    ready = scratch / "ready"
    ready.unlink(missing_ok=True)
    tokens = scratch / "tokens"
    tokens.write_text(TOKENS_FILE, encoding="utf-8")
    log = (scratch / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "reference_server", "--port", "0", "--ready-file", str(ready), *SERVER_ARGS,
         "--auth", str(tokens)],
        cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        port = _wait_ready(server, ready, 60.0)
        if port is None:
            return Verdict(mutant.id, True, "server did not start", time.monotonic() - started, None)
        report = scratch / "report.json"
        report.unlink(missing_ok=True)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "conformance", "run", "--target", f"127.0.0.1:{port}", "--level", "all",
                 "--time-scale", TIME_SCALE, "--json", str(report), "--quiet", "--repro-dir", str(scratch / "repro"),
                 "--baseline", str(KNOWN_FAILURES), "--token", CLIENT_TOKEN, "--admin-token", ADMIN_TOKEN],
                cwd=ROOT, capture_output=True, text=True, timeout=MUTANT_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Verdict(
                mutant.id, True, "hung (harness run past its limit)", time.monotonic() - started, None
            )
        failing = _failing(report)
        if done.returncode == 0:
            return Verdict(mutant.id, False, "survived", time.monotonic() - started, 0)
        how = f"failed: {', '.join(failing[:8])}" if failing else f"harness exit {done.returncode}"
        return Verdict(mutant.id, True, how, time.monotonic() - started, done.returncode)
    finally:
        _stop(server)
        log.close()


def _wait_ready(server: subprocess.Popen[bytes], ready: Path, timeout_s: float) -> int | None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if ready.exists() and ready.read_text().strip():
            return int(ready.read_text())
        if server.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, 15)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait(5)


def _failing(report: Path) -> list[str]:
    if not report.exists():
        return []
    data = json.loads(report.read_text())
    return [c["id"] for c in data.get("cases", []) if c["verdict"] in ("FAIL", "ERROR")]


# ── commands ─────────────────────────────────────────────────────────────────────────────────


def _done() -> dict[str, dict[str, object]]:
    if not RESULTS.exists():
        return {}
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    return {str(r["id"]): r for r in rows}


def run(args: argparse.Namespace) -> int:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    done = _done()
    chosen = sample(all_mutants(), args.sample, args.seed)
    todo = [
        (m, src) for m, src in chosen if fnmatch.fnmatch(m.id, args.only) and (m.id not in done or args.again)
    ]
    stop_at = time.monotonic() + args.minutes * 60
    print(f"{len(todo)} mutants to judge ({len(done)} judged before)", flush=True)
    with tempfile.TemporaryDirectory(prefix="lmrpc-mutation-") as tmp:
        for mutant, source in todo:
            if time.monotonic() >= stop_at:
                print("chunk time is up; run again to continue", flush=True)
                break
            verdict = judge(mutant, source, Path(tmp))
            row = {**asdict(mutant), **asdict(verdict)}
            with RESULTS.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            word = "killed " if verdict.killed else "SURVIVED"
            print(f"{word} {mutant.id} ({verdict.seconds:.1f}s) {verdict.how[:120]}", flush=True)
    return 0


def equivalents() -> dict[str, str]:
    if not EQUIVALENT.exists():
        return {}
    out = {}
    for line in EQUIVALENT.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            mutant_id, _, reason = line.partition(" ")
            out[mutant_id] = reason.strip()
    return out


def report(args: argparse.Namespace) -> int:
    every = all_mutants()
    current = {m.id: m for m, _ in sample(every, args.sample, args.seed)}
    done = {k: v for k, v in _done().items() if k in current}
    equivalent = equivalents()
    stale = sorted(set(equivalent) - {m.id for m, _ in every})
    survivors = [r for r in done.values() if not r["killed"]]
    unexplained = [r for r in survivors if r["id"] not in equivalent]
    wrongly = [r for r in done.values() if r["killed"] and r["id"] in equivalent]
    judged = len(done)
    killed = judged - len(survivors)
    eligible = judged - (len(survivors) - len(unexplained))
    scope = (
        f"a sample of {len(current)} (seed {args.seed}) of {len(every)}"
        if len(current) < len(every)
        else f"{len(every)}"
    )
    print(f"mutants: {scope} generated, {judged} judged, {killed} killed, {len(survivors)} survived")
    print(f"equivalent (bench/mutation-equivalent.txt): {len(survivors) - len(unexplained)}")
    if eligible:
        print(f"score: {killed}/{eligible} non-equivalent mutants killed = {100 * killed / eligible:.1f} %")
    for r in unexplained:
        print(f"  SURVIVOR {r['id']}: {r['before']!r} -> {r['after']!r}")
    for r in wrongly:
        print(f"  listed as equivalent but killed: {r['id']} ({r['how']})")
    for mutant_id in stale:
        print(f"  stale equivalence entry (no such mutant): {mutant_id}")
    if args.verbose:
        by_file: dict[str, list[int]] = {}
        for r in done.values():
            by_file.setdefault(str(r["file"]), [0, 0])[0 if r["killed"] else 1] += 1
        for path, (k, s) in by_file.items():
            print(f"  {path}: {k} killed, {s} survived")
    return 0 if not unexplained and len(done) == len(current) else 1


def show(args: argparse.Namespace) -> int:
    for mutant, source in all_mutants():
        if mutant.id == args.id:
            original = (ROOT / mutant.file).read_text(encoding="utf-8")
            sys.stdout.writelines(
                difflib.unified_diff(
                    original.splitlines(True), source.splitlines(True), mutant.file, mutant.id, n=2
                )
            )
            return 0
    print(f"no mutant {args.id}", file=sys.stderr)
    return 2


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/mutation.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_p = commands.add_parser("run", help="judge mutants not judged yet, for at most --minutes")
    run_p.add_argument("--minutes", type=float, default=9.0)
    run_p.add_argument("--only", default="*", help="a glob over mutant ids")
    run_p.add_argument("--again", action="store_true", help="judge matching mutants again")
    report_p = commands.add_parser("report", help="score, survivors and equivalence entries")
    for command in (run_p, report_p):
        command.add_argument("--sample", type=int, default=None, metavar="N", help="a stratified sample of N")
        command.add_argument("--seed", type=int, default=13, help="the sample's seed (default 13)")
    report_p.add_argument("--verbose", "-v", action="store_true")
    show_p = commands.add_parser("show", help="the diff of one mutant")
    show_p.add_argument("id")
    args = parser.parse_args()
    return {"run": run, "report": report, "show": show}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
