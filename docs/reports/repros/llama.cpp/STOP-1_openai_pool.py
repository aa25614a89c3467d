#!/usr/bin/env python3
"""Repro for lmrpc conformance case STOP-1[openai,pool] (OpenAI-compatible HTTP): replays its calls and
prints every answer as it arrives.

    python3 repro.py [BASE_URL]      (default: http://127.0.0.1:8080/v1)

What the harness saw:
- chat stream n=1: content of choice 0: want no stop string of [' '], got New 新 新 新 新 新
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

nan, inf = float("nan"), float("inf")
BASE = sys.argv[1].rstrip("/") if len(sys.argv) > 1 else 'http://127.0.0.1:8080/v1'
ROOT = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(BASE))
START = time.monotonic()
LOCK = threading.Lock()


def say(label, text):
    with LOCK:
        print(f"{time.monotonic() - START:7.3f}s {label} {text}", flush=True)


def call(label, at_s, method, url, body=None, raw=None, headers=None, disconnect_after=None, unread=False):
    time.sleep(max(0.0, at_s - (time.monotonic() - START)))
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "Content-Type" not in (headers or {}):
        request.add_header("Content-Type", "application/json")
    say(label, f"-> {method} {url} {(data or b'').decode(errors='replace')[:2000]}")
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as error:
        say(label, f"<- HTTP {error.code} {error.read().decode(errors='replace')[:2000]}")
        return
    except OSError as error:
        say(label, f"<- {type(error).__name__}: {error}")
        return
    say(label, f"<- HTTP {response.status} content-type: {response.headers.get('content-type')}")
    if unread:
        say(label, "not reading the body (a client that stopped reading); holding the connection 5 s")
        time.sleep(5)
        response.close()
        return
    events = 0
    try:
        for line in response:
            text = line.decode(errors="replace").rstrip("\r\n")
            say(label, f"<- {text}")
            if text.startswith("data:"):
                events += 1
                if disconnect_after is not None and events >= disconnect_after:
                    say(label, f"closing the connection after {events} events")
                    break
    except OSError as error:
        say(label, f"<- the body broke off: {type(error).__name__}: {error}")
    finally:
        response.close()
    say(label, "end")


CALLS = [
    (('[0]', 0.000, 'POST', BASE + '/chat/completions'), {'body': {'messages': [{'role': 'user', 'content': '新 新 新 新 新 新 新 新'}], 'max_tokens': 16, 'temperature': 0, 'stop': [' '], 'stream': True, 'model': 'SmolLM2-135M-Instruct.Q4_1.gguf'}}),
]

threads = [threading.Thread(target=call, args=args, kwargs=kwargs) for args, kwargs in CALLS]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
