#!/usr/bin/python3
"""N concurrent streaming chat requests against one OpenAI-compatible server (hearth-openai
or llama-server), all released at once; prints one JSON line: generated tokens, wall time
from release to the last stream's end, and their ratio (aggregate tok/s).

usage: bench/openai_streams.py URL N MAX_TOKENS [--ignore-eos] [--salt S]
S (a number) changes every prompt, so a round never finds the last round's prompts cached.
Tokens are counted from each stream's usage chunk (stream_options.include_usage); a stream
without one counts its content chunks, and a stream that fails fails the run."""
import http.client
import json
import sys
import threading
import time
import urllib.parse


def one(url, body, out, i, barrier):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    barrier.wait()
    conn.request("POST", u.path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        out[i] = {"error": "HTTP %d: %s" % (resp.status, resp.read()[:200])}
        return
    chunks, usage, done, first, last = 0, None, False, b"", b""
    for raw in resp:
        if not first:
            first = raw[:200]
        if raw.strip():
            last = raw[:300]
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for c in ev.get("choices") or []:
            if (c.get("delta") or {}).get("content"):
                chunks += 1
    out[i] = {"tokens": usage["completion_tokens"] if usage else chunks,
              "prompt": usage["prompt_tokens"] if usage else None,
              "done": done, "end": time.monotonic(), "first": first.decode("utf-8", "replace"),
              "last": last.decode("utf-8", "replace")}
    conn.close()


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    url, n, max_tokens = argv[1], int(argv[2]), int(argv[3])
    ignore_eos = "--ignore-eos" in argv[4:]
    salt = int(argv[argv.index("--salt") + 1]) if "--salt" in argv[4:] else 0
    words = ("river stone lamp orchard winter copper meadow harbor lantern thistle "
             "granite violet ember willow quarry falcon").split()
    bodies = []
    for i in range(n):
        # Each client's text differs from the first token on, so no engine can share one
        # client's prompt with another's (hearth's prefix cache, llama-server's slots).
        text = " ".join(words[(i * 7 + salt * 5 + k * 3) % len(words)] for k in range(29))
        b = {"model": "m", "messages": [{"role": "user", "content": "%d.%d. %s" % (salt, i, text)}],
             "max_tokens": max_tokens, "temperature": 0, "seed": i + 1, "stream": True,
             "stream_options": {"include_usage": True}}
        if ignore_eos:
            b["ignore_eos"] = True   # an extension hearth-openai and llama-server both take
        bodies.append(json.dumps(b).encode())
    out = [None] * n
    barrier = threading.Barrier(n + 1)
    ts = [threading.Thread(target=one, args=(url, bodies[i], out, i, barrier)) for i in range(n)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.monotonic()
    for t in ts:
        t.join()
    bad = [o for o in out if o is None or "error" in o or not o["done"]]
    if bad:
        print(json.dumps({"error": "%s: %s" % (url, bad[0])}))
        return 1
    tok = sum(o["tokens"] for o in out)
    wall = max(o["end"] for o in out) - t0
    for o in out:
        del o["first"], o["last"]
    print(json.dumps({"streams": n, "tokens": tok, "prompt_tokens": [o["prompt"] for o in out],
                      "wall_s": round(wall, 3), "aggregate_tps": round(tok / wall, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
