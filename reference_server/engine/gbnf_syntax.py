"""The contract's EBNF, parsed: llama.cpp's GBNF (rules ``name ::= expression`` from the start rule
``root``) as a tree of characters, sequences, alternatives, repetitions and rule references, with
the character-set arithmetic the conversion to llguidance (``gbnf.py``) needs.

The syntax is llama.cpp's: ``#`` comments; a rule ends at the end of its line, except inside
parentheses and after ``|``; strings in double quotes and character classes (``[a-z]``,
``[^"\\\\]``) with the escapes ``\\x..``, ``\\u....``, ``\\U........``, ``\\t``, ``\\r``,
``\\n``, ``\\\\``, ``\\"``, ``\\[``, ``\\]``; ``.`` (any character); ``*``, ``+``, ``?``,
``{m}``, ``{m,}``, ``{m,n}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]"}
HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
MAX_CODE_POINT = 0x10FFFF
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_INT = re.compile(r"[0-9]+")

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code point ranges


class GbnfError(ValueError):
    """Not a GBNF grammar; the message says what and where (line and column)."""


# The grammar as a tree; nodes compare by identity (each occurrence is its own).
@dataclass(eq=False)
class Chars:
    ranges: Ranges  # one character from these


@dataclass(eq=False)
class Seq:
    items: list[Node]


@dataclass(eq=False)
class Alt:
    options: list[Node]


@dataclass(eq=False)
class Rep:
    item: Node
    low: int
    high: int | None  # None: no bound


@dataclass(eq=False)
class Ref:
    name: str


Node = Chars | Seq | Alt | Rep | Ref


class Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.rules: dict[str, Node] = {}  # by GBNF name, in order
        self.used: dict[str, int] = {}  # a name referred to -> where first

    def grammar(self) -> dict[str, Node]:
        self.space(newlines=True)
        while self.pos < len(self.text):
            self.rule()
            self.space(newlines=True)
        if "root" not in self.rules:
            raise GbnfError("no rule 'root'")
        for name, at in self.used.items():
            if name not in self.rules:
                raise GbnfError(f"rule {name!r} is not defined ({self.where(at)})")
        return self.rules

    def rule(self) -> None:
        start = self.pos
        name = self.name()
        self.space(newlines=False)
        if not self.text.startswith("::=", self.pos):
            raise GbnfError(f"expected '::=' after the rule name ({self.where()})")
        self.pos += 3
        self.space(newlines=True)
        body = self.alternatives(nested=False)
        if self.pos < len(self.text) and self.text[self.pos] not in "\r\n":
            raise GbnfError(f"unexpected {self.text[self.pos]!r} ({self.where()})")
        if name in self.rules:
            raise GbnfError(f"rule {name!r} is defined twice ({self.where(start)})")
        self.rules[name] = body

    def alternatives(self, *, nested: bool) -> Node:
        options = [self.sequence(nested=nested)]
        while self.peek() == "|":
            self.pos += 1
            self.space(newlines=True)
            options.append(self.sequence(nested=nested))
        return options[0] if len(options) == 1 else Alt(options)

    def sequence(self, *, nested: bool) -> Node:
        items: list[Node] = []
        while True:
            ch = self.peek()
            item: Node
            if ch == '"':
                item = self.string()
            elif ch == "[":
                item = self.char_class()
            elif ch == "(":
                self.pos += 1
                self.space(newlines=True)
                item = self.alternatives(nested=True)
                if self.peek() != ")":
                    raise GbnfError(f"expected ')' ({self.where()})")
                self.pos += 1
            elif ch == ".":
                self.pos += 1
                item = Chars(((0, MAX_CODE_POINT),))
            elif ch and _NAME.match(ch):
                at = self.pos
                item = Ref(self.name())
                self.used.setdefault(item.name, at)
            else:
                break
            self.space(newlines=nested)
            while (op := self.peek()) in ("*", "+", "?", "{"):
                self.pos += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(op) or self.bounds()
                item = Rep(item, low, high)
                self.space(newlines=nested)
            items.append(item)
        return items[0] if len(items) == 1 else Seq(items)

    def bounds(self) -> tuple[int, int | None]:
        self.space(newlines=True)
        low = self.integer()
        self.space(newlines=True)
        high: int | None = low
        if self.peek() == ",":
            self.pos += 1
            self.space(newlines=True)
            high = self.integer() if _INT.match(self.text, self.pos) else None
            self.space(newlines=True)
        if self.peek() != "}":
            raise GbnfError(f"expected '}}' ({self.where()})")
        self.pos += 1
        if high is not None and high < low:
            raise GbnfError(f"repetition {{{low},{high}}}: the most is less than the least")
        return low, high

    def string(self) -> Node:
        self.pos += 1  # the opening quote
        chars: list[Node] = []
        while True:
            if self.pos >= len(self.text):
                raise GbnfError(f"unterminated string ({self.where()})")
            if self.text[self.pos] == '"':
                self.pos += 1
                break
            code = ord(self.char())
            chars.append(Chars(((code, code),)))
        return chars[0] if len(chars) == 1 else Seq(chars)

    def char_class(self) -> Node:
        self.pos += 1  # [
        negated = self.peek() == "^"
        self.pos += negated
        ranges: list[tuple[int, int]] = []
        while True:
            if self.pos >= len(self.text):
                raise GbnfError(f"unterminated character class ({self.where()})")
            if self.text[self.pos] == "]":
                self.pos += 1
                break
            low = ord(self.char())
            high = low
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                high = ord(self.char())
                if high < low:
                    raise GbnfError(
                        f"character range {chr(low)!r}-{chr(high)!r} is backwards ({self.where()})"
                    )
            ranges.append((low, high))
        merged = merge_ranges(ranges)
        if negated:
            merged = complement(merged)
        if not merged:
            raise GbnfError(f"a character class that matches nothing ({self.where()})")
        return Chars(merged)

    def char(self) -> str:
        at = self.pos
        ch = self.text[at]
        if ch != "\\":
            self.pos += 1
            return ch
        code = self.text[at + 1 : at + 2]
        if code in ESCAPES:
            self.pos += 2
            return ESCAPES[code]
        if code in HEX_DIGITS:
            digits = self.text[at + 2 : at + 2 + HEX_DIGITS[code]]
            if len(digits) != HEX_DIGITS[code] or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise GbnfError(f"\\{code} takes {HEX_DIGITS[code]} hex digits ({self.where(at)})")
            value = int(digits, 16)
            if value > MAX_CODE_POINT or 0xD800 <= value <= 0xDFFF:
                raise GbnfError(f"\\{code}{digits} is not a Unicode character ({self.where(at)})")
            self.pos += 2 + len(digits)
            return chr(value)
        raise GbnfError(f"unknown escape \\{code} ({self.where(at)})")

    def name(self) -> str:
        found = _NAME.match(self.text, self.pos)
        if found is None:
            raise GbnfError(f"expected a rule name ({self.where()})")
        self.pos = found.end()
        return found.group()

    def integer(self) -> int:
        found = _INT.match(self.text, self.pos)
        if found is None:
            raise GbnfError(f"expected a number ({self.where()})")
        self.pos = found.end()
        return int(found.group())

    def space(self, *, newlines: bool) -> None:
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if ch in " \t" or (newlines and ch in "\r\n"):
                self.pos += 1
            elif ch == "#":
                while self.pos < len(text) and text[self.pos] not in "\r\n":
                    self.pos += 1
            else:
                break

    def peek(self) -> str:
        return self.text[self.pos : self.pos + 1]

    def where(self, at: int | None = None) -> str:
        at = self.pos if at is None else at
        line = self.text.count("\n", 0, at) + 1
        return f"line {line}, column {at - (self.text.rfind(chr(10), 0, at) + 1) + 1}"


def children(node: Node) -> list[Node]:
    match node:
        case Seq(items):
            return items
        case Alt(options):
            return options
        case Rep(item, _, _):
            return [item]
    return []


def walk(node: Node) -> Iterator[Node]:
    yield node
    for child in children(node):
        yield from walk(child)


def merge_ranges(ranges: list[tuple[int, int]]) -> Ranges:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def union(*sets: Ranges) -> Ranges:
    return merge_ranges([r for s in sets for r in s])


def complement(ranges: Ranges) -> Ranges:
    result, next_low = [], 0
    for low, high in ranges:
        if low > next_low:
            result.append((next_low, low - 1))
        next_low = high + 1
    if next_low <= MAX_CODE_POINT:
        result.append((next_low, MAX_CODE_POINT))
    return tuple(result)


def overlap(a: Ranges, b: Ranges) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][1] < b[j][0]:
            i += 1
        elif b[j][1] < a[i][0]:
            j += 1
        else:
            return True
    return False
