#!/usr/bin/python3
"""hearth's side of `make bench-grammar`: decode speed of a running hearthd with and without
a JSON Schema, in alternating rounds so that a shared machine's drift falls on both alike.

usage: bench/grammar_drive.py SOCKET ROUNDS TOKENS SCHEMA LONG_KEYS_SCHEMA
Each round runs, in an order that flips every round (ABBA), greedy generations of TOKENS
tokens from the same prompt: unconstrained (ignore_eos), under SCHEMA without and with
jump-forward, and under LONG_KEYS_SCHEMA (long fixed keys) without and with it. Prints one
JSON object: per kind the daemon's own decode tokens/s (done.decode_tps: tokens after the
first over the time after the first), generated and forced tokens, time to the whole output,
and per round the ratio of the schema runs to the unconstrained run of the same round.
"""
import json
import sys

import drive  # bench/drive.py: also puts the Python client on the path

PROMPT = "Output:"


def main(argv):
    if len(argv) != 6:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    sock, rounds, tokens = argv[1], int(argv[2]), int(argv[3])
    schema = open(argv[4], encoding="utf-8").read()
    long_keys = open(argv[5], encoding="utf-8").read()
    c = drive.connect(sock, "bench-grammar")
    if c is None:
        return 1
    kinds = {
        "plain": dict(ignore_eos=True),
        "schema": dict(json_schema=schema, jump_forward=False),
        "schema_jump": dict(json_schema=schema, jump_forward=True),
        "long_keys": dict(json_schema=long_keys, jump_forward=False),
        "long_keys_jump": dict(json_schema=long_keys, jump_forward=True),
    }

    def run(kind):
        g = c.generate(PROMPT, max_tokens=tokens, temperature=0.0, **kinds[kind]).wait()
        d = g.done
        return {"decode_tps": d["decode_tps"], "n_gen": d["n_gen"], "n_forced": d.get("n_forced", 0),
                "ms": d["prefill_ms"] + d["decode_ms"], "bytes": sum(len(t.text) for t in g.tokens),
                "finish": d["finish"]}

    # warm-up: compiles both grammars into the daemon's cache, faults the weights in
    for kind in kinds:
        run(kind)
    res = {k: [] for k in kinds}
    order = list(kinds)
    for r in range(rounds):
        for kind in (order if r % 2 == 0 else order[::-1]):
            res[kind].append(run(kind))
        print(f"grammar_drive: round {r + 1}/{rounds}: " + ", ".join(
            f"{k} {res[k][-1]['decode_tps']:.2f}" for k in kinds) + " tok/s", file=sys.stderr)
    out = {"engine": "hearth", "rounds": rounds, "tokens": tokens, "runs": res,
           "ratio_schema": [s["decode_tps"] / p["decode_tps"] for s, p in zip(res["schema"], res["plain"])],
           "ratio_schema_jump": [s["decode_tps"] / p["decode_tps"]
                                 for s, p in zip(res["schema_jump"], res["plain"])]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
