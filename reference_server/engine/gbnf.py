"""The contract's EBNF (``Constraint.ebnf``: llama.cpp's GBNF, rules ``name ::= expression``
from the start rule ``root``) as an llguidance Lark grammar with the same sentences.

llguidance lexes greedily: a lexeme (a string, a regex, an uppercase rule) takes the longest
text it can, whatever follows it, and of two lexemes that could start at one place it keeps the
one that goes on. A grammar whose lexemes can run on into what follows them, or that offers two
lexemes with a first character in common at one place, loses sentences. llguidance's own
converter (``llguidance.gbnf_to_lark``) makes each rule that refers to no other rule a lexeme;
measured on llguidance 1.9.1, ``root ::= num "0"`` with ``num ::= [0-9]+`` then accepts no text
at all ("10" and "100" included), ``root ::= a b`` with ``a ::= "x"*`` and ``b ::= "x"`` only
"x", and ``root ::= "ab" | "a" "bd"`` not "abd"; on 150 random grammars over "abc" it disagreed
with xgrammar 0.2.8 (which parses GBNF exactly) on 76, about texts of up to 5 characters.

So here every rule is a parser rule and every lexeme one character (a character of a string, a
character class, ``.``), which no greediness can mislead, except where a part of a rule that
refers to no rule is safe to lex as one regex (``_fusable``): nothing that may follow it can
continue it, and no other lexeme that could start where it starts shares a first character with
it. Small rules that refer to no rule in the end are first copied into the places that use them
(``_inlined``), so a grammar that is regular as a whole (``root ::= word (" " word)*`` with
``word ::= [a-z]+``) is one regex. That keeps the Earley parser off the characters of a run of
text where it can: a line of free text (``root ::= [^\\n]* "\\n"``) costs 2.6 ms a token a
character at a time and 12 µs as one lexeme, the words 320 µs and 50-100 µs. Where it cannot
(the text of a string in a JSON grammar written in GBNF, whose closing quote that check
cannot tell from an opening one), a token costs 1-1.5 ms. Both conversions agreed with xgrammar
on each of 60,000 texts of 1,000 such random grammars, and the fused one is tested against the
other (``tests/unit/engine/test_gbnf.py``); should llguidance's bounds refuse the fused
regexes, the server compiles the other. Pure text; llguidance is not imported.

The grammar is parsed by ``gbnf_syntax``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from reference_server.engine.gbnf_syntax import (
    Alt,
    Chars,
    GbnfError,
    Node,
    Parser,
    Ranges,
    Ref,
    Rep,
    Seq,
    children,
    overlap,
    union,
    walk,
)

__all__ = ["GbnfError", "gbnf_to_lark"]

MAX_FUSED_COUNT = 1000  # a bounded repetition past this stays a parser rule (O(log n) of them)
MAX_INLINED_NODES = 256  # a rule past this stays a rule


def gbnf_to_lark(text: str, *, fuse: bool = True) -> str:
    """The Lark grammar (llguidance's dialect) whose sentences from ``start`` are those of
    ``text`` from ``root``; ``fuse=False``: every lexeme one character, none fused (slower, and
    what the fused grammar is tested against)."""
    rules = Parser(text).grammar()
    if not fuse:
        return _Emitter(rules, set()).grammar()
    rules = _inlined(rules)
    return _Emitter(rules, _Analysis(rules).fused()).grammar()


def _inlined(rules: dict[str, Node]) -> dict[str, Node]:
    """The rules with each reference to a small rule that refers, in the end, to no rule at all
    (as ``word ::= [a-z]+``) replaced by a copy of it, so that each place has its own nodes
    (and its own context, where a rule shared between places has theirs all at once) and a part
    that uses it can be fused; the rules no longer referred to are dropped."""
    expanded: dict[str, Node | None] = {}  # None: not inlined (recursive, too large, or refers to one)
    visiting: set[str] = set()

    def expand(name: str) -> Node | None:
        if name not in expanded:
            if name in visiting:
                return None
            visiting.add(name)
            body = substitute(rules[name])
            visiting.discard(name)
            small = sum(1 for _ in walk(body)) <= MAX_INLINED_NODES
            expanded[name] = body if small and not any(isinstance(n, Ref) for n in walk(body)) else None
        return expanded[name]

    def substitute(node: Node) -> Node:
        match node:
            case Ref(name):
                body = expand(name)
                return node if body is None else copy.deepcopy(body)
            case Seq(items):
                return Seq([substitute(i) for i in items])
            case Alt(options):
                return Alt([substitute(o) for o in options])
            case Rep(item, low, high):
                return Rep(substitute(item), low, high)
        return node

    # the copies are fresh and every other node is in one rule once: each node is one place
    bodies = {name: substitute(body) for name, body in rules.items()}
    reached, todo = {"root"}, ["root"]
    while todo:
        for node in walk(bodies[todo.pop()]):
            if isinstance(node, Ref) and node.name not in reached:
                reached.add(node.name)
                todo.append(node.name)
    return {name: body for name, body in bodies.items() if name in reached}


@dataclass
class _Context:
    """Where a node may stand: the characters that may come right after it, and right before it
    (``start``: it may begin the text)."""

    follow: Ranges = ()
    precede: Ranges = ()
    start: bool = False

    def widen(self, follow: Ranges, precede: Ranges, start: bool) -> bool:
        wider = _Context(union(self.follow, follow), union(self.precede, precede), self.start or start)
        changed = wider != self
        self.follow, self.precede, self.start = wider.follow, wider.precede, wider.start
        return changed


@dataclass
class _Analysis:
    """Which parts of the grammar are safe to lex as one regex each (see the module's docstring).

    For each node: whether it can match the empty text, its first and last characters, the
    characters that can continue a whole match of it (``extend``), and where it may stand
    (``_Context``: the characters around it, found by a fixpoint over the rules). A part is
    fused when (1) it refers to no rule and cannot match the empty text (or is a ``x*``/``x{0,n}``
    of such an ``x``, fused as an optional ``x+``), (2) no character that may follow it can
    continue it, and (3) no character lexeme elsewhere that may follow a character that may
    precede it (or begin the text where it may) shares a first character with it: any two
    lexemes that could start at one place after one text pass this last test, so the greedy
    lexer never has two at once that could both take the same next character."""

    rules: dict[str, Node]
    nullable: dict[int, bool] = field(default_factory=dict)
    first: dict[int, Ranges] = field(default_factory=dict)
    last: dict[int, Ranges] = field(default_factory=dict)
    contexts: dict[int, _Context] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._fix_nullable_first_last()
        self._fix_contexts()

    def fused(self) -> set[int]:
        """The ids of the nodes to lex as one regex each."""
        lexemes: dict[tuple[Ranges, bool], list[Chars]] = {}  # the character lexemes, by what may precede
        for node in self._all():
            if isinstance(node, Chars):
                context = self.contexts[id(node)]
                lexemes.setdefault((context.precede, context.start), []).append(node)
        fused: set[int] = set()

        def visit(node: Node) -> None:
            if self._fusable(node, lexemes):
                fused.add(id(node))
                return
            for child in children(node):
                visit(child)

        for body in self.rules.values():
            visit(body)
        return fused

    def _fusable(self, node: Node, lexemes: dict[tuple[Ranges, bool], list[Chars]]) -> bool:
        if isinstance(node, Ref) or _at_most_one_character(node) or not _regular(node):
            return False
        lexeme = Rep(node.item, 1, node.high) if isinstance(node, Rep) and node.low == 0 else node
        body = lexeme.item if lexeme is not node and isinstance(lexeme, Rep) else node  # x* is (x+)?
        if self.nullable[id(body)]:
            return False
        here = self.contexts[id(node)]
        if overlap(self._inner(lexeme), here.follow):
            return False  # (2)
        own = {id(n) for n in walk(node)}
        first = self.first[id(node)]
        for (precede, start), group in lexemes.items():  # (3)
            if not ((here.start and start) or overlap(here.precede, precede)):
                continue
            if any(id(lexeme) not in own and overlap(lexeme.ranges, first) for lexeme in group):
                return False
        return True

    def _inner(self, node: Node) -> Ranges:
        """The characters that can stand second or later in a match of ``node`` (a node that
        refers to no rule): a superset of those that can continue a whole match, since a match
        that goes on has one before the character it goes on with."""
        match node:
            case Chars():
                return ()
            case Alt(options):
                return union(*(self._inner(option) for option in options))
            case Rep(item, _, high):
                again = self.first[id(item)] if high is None or high > 1 else ()
                return union(self._inner(item), again)
            case Seq(items):
                return union(*(self._inner(i) for i in items), *(self.first[id(i)] for i in items[1:]))
            case Ref():
                raise AssertionError("a node that refers to a rule is never fused")

    def _all(self) -> Iterator[Node]:
        for body in self.rules.values():
            yield from walk(body)

    def _fix_nullable_first_last(self) -> None:
        rule_nullable = dict.fromkeys(self.rules, False)
        rule_first: dict[str, Ranges] = dict.fromkeys(self.rules, ())
        rule_last: dict[str, Ranges] = dict.fromkeys(self.rules, ())
        changed = True
        while changed:
            for body in self.rules.values():
                self._facts(body, rule_nullable, rule_first, rule_last)
            changed = False
            for name, body in self.rules.items():
                facts = (self.nullable[id(body)], self.first[id(body)], self.last[id(body)])
                if facts != (rule_nullable[name], rule_first[name], rule_last[name]):
                    rule_nullable[name], rule_first[name], rule_last[name] = facts
                    changed = True

    def _facts(
        self,
        node: Node,
        rule_nullable: dict[str, bool],
        rule_first: dict[str, Ranges],
        rule_last: dict[str, Ranges],
    ) -> None:
        for child in children(node):
            self._facts(child, rule_nullable, rule_first, rule_last)
        key = id(node)
        match node:
            case Chars(ranges):
                self.nullable[key], self.first[key], self.last[key] = False, ranges, ranges
            case Ref(name):
                self.nullable[key] = rule_nullable[name]
                self.first[key], self.last[key] = rule_first[name], rule_last[name]
            case Alt(options):
                self.nullable[key] = any(self.nullable[id(o)] for o in options)
                self.first[key] = union(*(self.first[id(o)] for o in options))
                self.last[key] = union(*(self.last[id(o)] for o in options))
            case Rep(item, low, high):
                empty = high == 0
                self.nullable[key] = empty or low == 0 or self.nullable[id(item)]
                self.first[key] = () if empty else self.first[id(item)]
                self.last[key] = () if empty else self.last[id(item)]
            case Seq(items):
                self.nullable[key] = all(self.nullable[id(i)] for i in items)
                self.first[key] = self._edge(items)
                self.last[key] = self._edge(items[::-1], last=True)

    def _edge(self, items: list[Node], *, last: bool = False) -> Ranges:
        result: Ranges = ()
        for item in items:
            result = union(result, (self.last if last else self.first)[id(item)])
            if not self.nullable[id(item)]:
                break
        return result

    def _fix_contexts(self) -> None:
        rule_context = {name: _Context() for name in self.rules}
        rule_context["root"].start = True
        changed = True
        while changed:
            changed = False
            for name, body in self.rules.items():
                context = rule_context[name]
                changed |= self._place(body, context.follow, context.precede, context.start, rule_context)

    def _place(
        self, node: Node, follow: Ranges, precede: Ranges, start: bool, rules: dict[str, _Context]
    ) -> bool:
        """Widens the contexts of ``node`` and what is in it; whether any rule's context grew."""
        self.contexts.setdefault(id(node), _Context()).widen(follow, precede, start)
        changed = False
        match node:
            case Ref(name):
                changed = rules[name].widen(follow, precede, start)
            case Alt(options):
                for option in options:
                    changed |= self._place(option, follow, precede, start, rules)
            case Rep(item, _, high):
                again = high is None or high > 1
                inner_follow = union(follow, self.first[id(item)]) if again else follow
                inner_precede = union(precede, self.last[id(item)]) if again else precede
                changed = self._place(item, inner_follow, inner_precede, start, rules)
            case Seq(items):
                for i, item in enumerate(items):
                    before, after = items[:i], items[i + 1 :]
                    item_follow = union(
                        self._edge(after), follow if all(self.nullable[id(a)] for a in after) else ()
                    )
                    open_before = all(self.nullable[id(b)] for b in before)
                    item_precede = union(self._edge(before[::-1], last=True), precede if open_before else ())
                    changed |= self._place(item, item_follow, item_precede, start and open_before, rules)
        return changed


class _Emitter:
    def __init__(self, rules: dict[str, Node], fused: set[int]) -> None:
        self.rules = rules
        self.fused = fused
        self.names: dict[str, str] = {}

    def grammar(self) -> str:
        return "".join(f"{self.lark_name(name)}: {self.lark(body)}\n" for name, body in self.rules.items())

    def lark(self, node: Node) -> str:
        if id(node) in self.fused:
            if isinstance(node, Rep) and node.low == 0:
                return f"(/{_regex(Rep(node.item, 1, node.high))}/)?"
            return f"/{_regex(node)}/"
        match node:
            case Chars(ranges):
                if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
                    return json.dumps(chr(ranges[0][0]))
                return f"/{_regex(node)}/"
            case Ref(name):
                return self.lark_name(name)
            case Seq(items):
                parts = [f"({self.lark(i)})" if isinstance(i, Alt) else self.lark(i) for i in items]
                return " ".join(parts) or '""'
            case Alt(options):
                return " | ".join(self.lark(option) for option in options)
            case Rep(item, low, high):
                if high == 0:
                    return '""'  # llguidance refuses x{0}
                inner = self.lark(item)
                if not isinstance(item, Chars | Ref) or id(item) in self.fused:
                    inner = f"({inner})"
                return inner + _operator(low, high)
        raise AssertionError(node)

    def lark_name(self, name: str) -> str:
        """``root`` is ``start``; another name, lowercased into Lark's rule names, each its own."""
        lark = self.names.get(name)
        if lark is None:
            lark = "start" if name == "root" else re.sub(r"[^a-z0-9_-]", "_", name.lower())
            if name != "root" and not lark[0].isalpha():
                lark = "r_" + lark
            taken = set(self.names.values()) | {"start"}
            base, n = lark, 1
            while name != "root" and lark in taken:
                n += 1
                lark = f"{base}_{n}"
            self.names[name] = lark
        return lark


def _regex(node: Node) -> str:
    """A node that refers to no rule as a regex (the regex crate's syntax)."""
    match node:
        case Chars(ranges):
            if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
                return _code(ranges[0][0])
            return "[" + "".join(_code(a) if a == b else f"{_code(a)}-{_code(b)}" for a, b in ranges) + "]"
        case Seq(items):
            return "".join(f"(?:{_regex(i)})" if isinstance(i, Alt) else _regex(i) for i in items) or "(?:)"
        case Alt(options):
            return "|".join(_regex(option) for option in options)
        case Rep(item, low, high):
            if high == 0:
                return "(?:)"
            return f"(?:{_regex(item)}){_operator(low, high)}"
        case Ref():
            raise AssertionError("a node that refers to a rule is never fused")
    raise AssertionError(node)


def _operator(low: int, high: int | None) -> str:
    match (low, high):
        case (0, None):
            return "*"
        case (1, None):
            return "+"
        case (0, 1):
            return "?"
        case (_, None):
            return f"{{{low},}}"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


def _code(code: int) -> str:
    return f"\\x{{{code:X}}}"


def _regular(node: Node) -> bool:
    """Refers to no rule, and has no repetition too long to lex (``MAX_FUSED_COUNT``)."""
    for part in walk(node):
        if isinstance(part, Ref) or (
            isinstance(part, Rep) and max(part.low, part.high or 0) > MAX_FUSED_COUNT
        ):
            return False
    return True


def _at_most_one_character(node: Node) -> bool:
    """No match is longer than one character: nothing to fuse."""
    match node:
        case Chars():
            return True
        case Alt(options):
            return all(_at_most_one_character(o) for o in options)
        case Rep(item, _, high):
            return high == 0 or (high == 1 and _at_most_one_character(item))
        case Seq(items):
            return not items
    return False
