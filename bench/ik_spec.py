#!/usr/bin/python3
"""ik_llama.cpp's prompt-lookup side of `make bench-spec`: its llama-simple (no drafts) against
its llama-lookup on the same greedy prompts, alternating per round. (The draft-model anchors
run through llama-server beside hearthd: bench/anchor_spec.py says why not llama-speculative.)

usage: bench/ik_spec.py lookup IK_BIN MODEL PROMPTS_JSON ROUNDS TOKENS THREADS
  lookup       llama-lookup (its prompt-lookup decoding, its defaults), -rtr, context 1024
PROMPTS_JSON is spec_drive.py's `prompts` output. Prints one JSON object: per prompt the
decode tok/s of llama-simple ("plain") and of the tool (under the tool's name), and the
tool's acceptance (%).
"""
import json
import os
import re
import subprocess
import sys


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace").stderr


def main(argv):
    if len(argv) != 8 or argv[1] != "lookup":
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    tool, ik, model, prompts, rounds, tokens, threads = argv[1:8]
    prompts = json.load(open(prompts))
    common = ["-m", model, "-t", threads, "-rtr"]
    extra = ["--temp", "0", "-c", "1024"]
    prompt_len = r"prompt eval time =\s+[\d.]+ ms /\s+(\d+) tokens"

    def tool_cmd(p):
        return [f"{ik}/llama-{tool}", *common, *extra, "-n", tokens, "-p", p]

    # llama-simple's -n counts the prompt too: a first run of the tool (untimed, a warm-up
    # as well) says how many tokens each prompt is.
    n_prompt = {}
    for name, p in prompts.items():
        m = re.search(prompt_len, run(tool_cmd(p)))
        if not m:
            sys.exit(f"llama-{tool}: no prompt length line")
        n_prompt[name] = int(m.group(1))
    out = {}
    for r in range(int(rounds)):
        for name, p in prompts.items():
            o = out.setdefault(name, {"plain": [], tool: [], "accept": []})
            for which in (("plain", tool) if r % 2 == 0 else (tool, "plain")):
                if which == "plain":
                    cmd = [f"{ik}/llama-simple", *common, "-n", str(n_prompt[name] + int(tokens)), "-p", p]
                else:
                    cmd = tool_cmd(p)
                t = run(cmd)
                m = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ s(?:econds)?, speed:\s+([\d.]+) t/s", t)
                if not m:
                    sys.exit(f"{cmd[0]}: no speed line")
                o[which].append(float(m.group(1)))
                a = re.search(r"accept\s+=\s+([\d.]+)%", t)
                if which == tool and a:
                    o["accept"].append(float(a.group(1)))
            print(f"ik round {r + 1}: {name} {o['plain'][-1]:.1f} -> {o[tool][-1]:.1f} t/s", file=sys.stderr)
    print(json.dumps({"engine": "ik_llama.cpp", "model": os.path.basename(model),
                      "rounds": int(rounds), "tokens": int(tokens), "runs": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
