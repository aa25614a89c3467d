"""Stand-alone repro scripts for the OpenAI profile: the HTTP calls a failing case made, replayed
with the Python standard library only (a server's developers need nothing of lmrpc to run it),
each at the offset the harness used, printing every status line, header and event as it comes.
The script's docstring says what the harness saw, so the wrong answer can be read beside it."""

from __future__ import annotations

from collections.abc import Sequence

from conformance.drivers.openai.calls import HttpCall
from conformance.vocabulary import Mismatch

_HEADER = '''#!/usr/bin/env python3
"""Repro for lmrpc conformance case {case_id} (OpenAI-compatible HTTP): replays its calls and
prints every answer as it arrives.

    python3 {filename} [BASE_URL]      (default: {base_url})

What the harness saw:
{seen}
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

nan, inf = float("nan"), float("inf")
BASE = sys.argv[1].rstrip("/") if len(sys.argv) > 1 else {base_url!r}
ROOT = "{{0.scheme}}://{{0.netloc}}".format(urllib.parse.urlsplit(BASE))
START = time.monotonic()
LOCK = threading.Lock()


def say(label, text):
    with LOCK:
        print(f"{{time.monotonic() - START:7.3f}}s {{label}} {{text}}", flush=True)


def call(label, at_s, method, url, body=None, raw=None, headers=None, disconnect_after=None, unread=False):
    time.sleep(max(0.0, at_s - (time.monotonic() - START)))
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {{}})
    if data is not None and "Content-Type" not in (headers or {{}}):
        request.add_header("Content-Type", "application/json")
    say(label, f"-> {{method}} {{url}} {{(data or b'').decode(errors='replace')[:2000]}}")
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as error:
        say(label, f"<- HTTP {{error.code}} {{error.read().decode(errors='replace')[:2000]}}")
        return
    except OSError as error:
        say(label, f"<- {{type(error).__name__}}: {{error}}")
        return
    say(label, f"<- HTTP {{response.status}} content-type: {{response.headers.get('content-type')}}")
    if unread:
        say(label, "not reading the body (a client that stopped reading); holding the connection 5 s")
        time.sleep(5)
        response.close()
        return
    events = 0
    try:
        for line in response:
            text = line.decode(errors="replace").rstrip("\\r\\n")
            say(label, f"<- {{text}}")
            if text.startswith("data:"):
                events += 1
                if disconnect_after is not None and events >= disconnect_after:
                    say(label, f"closing the connection after {{events}} events")
                    break
    except OSError as error:
        say(label, f"<- the body broke off: {{type(error).__name__}}: {{error}}")
    finally:
        response.close()
    say(label, "end")


CALLS = [
'''

_FOOTER = """]

threads = [threading.Thread(target=call, args=args, kwargs=kwargs) for args, kwargs in CALLS]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


def http_script(
    case_id: str,
    base_url: str,
    root_url: str,
    calls: Sequence[HttpCall],
    mismatches: Sequence[Mismatch],
    filename: str = "repro.py",
) -> str:
    seen = "\n".join(f"- {m.render()}" for m in mismatches) or "- (see the harness's report)"
    lines = [
        _HEADER.format(case_id=case_id, filename=filename, base_url=base_url, seen=_docstring_safe(seen))
    ]
    for i, c in enumerate(calls):
        url = _relative(c.url, base_url, root_url)
        kwargs: dict[str, object] = {}
        if c.body is not None:
            kwargs["body"] = c.body
        if c.content is not None:
            kwargs["raw"] = c.content
        if c.headers:
            kwargs["headers"] = dict(c.headers)
        if c.disconnect_after is not None:
            kwargs["disconnect_after"] = c.disconnect_after
        if c.unread:
            kwargs["unread"] = True
        args = f"({f'[{i}]'!r}, {c.t_s:.3f}, {c.method!r}, {url})"
        lines.append(f"    ({args}, {_literal(kwargs)}),")
    return "".join(lines[:1]) + "\n".join(lines[1:]) + "\n" + _FOOTER


def _relative(url: str, base: str, root: str) -> str:
    if url.startswith(base):
        return f"BASE + {url[len(base) :]!r}"
    if url.startswith(root):
        return f"ROOT + {url[len(root) :]!r}"
    return repr(url)


def _literal(value: dict[str, object]) -> str:
    """The call's keyword arguments as a Python literal (``nan`` and ``inf`` are names the script defines)."""
    return "{" + ", ".join(f"{key!r}: {item!r}" for key, item in value.items()) + "}"


def _docstring_safe(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
