#!/usr/bin/env python3
# Native llama.cpp anchors for `make bench-speed`: runs one round of ik_llama.cpp's or mainline
# llama.cpp's own llama-bench on a file (pp, then tg after pp positions), and merges rounds of
# hearth and anchors into the result files bench_report.mjs and doc_tables.py read.
#   anchor_bench.py round ENGINE BIN_DIR MODEL THREADS PP TG   -> one JSON line on stdout
#   anchor_bench.py merge-hearth OUT ROUND.json...              -> hearth JSON, stats over rounds
#   anchor_bench.py merge-anchors ROUNDS.jsonl                  -> llama.json lines on stdout
import json
import statistics
import subprocess
import sys

# Each engine's own settings for the same two measurements: ik_llama.cpp with its CPU
# repack and flash attention (its recommended CPU set-up), tg at depth pp via -gp; mainline
# with flash attention and tg at depth pp via -d.
ENGINES = {
    "ik_llama.cpp": {
        "pp": lambda pp, tg: ["-p", str(pp), "-n", "0", "-rtr", "1", "-fa", "1"],
        "tg": lambda pp, tg: ["-p", "0", "-n", "0", "-gp", f"{pp},{tg}", "-rtr", "1", "-fa", "1"],
    },
    "llama.cpp": {
        "pp": lambda pp, tg: ["-p", str(pp), "-n", "0", "-fa", "on"],
        "tg": lambda pp, tg: ["-p", "0", "-n", str(tg), "-d", str(pp), "-fa", "on"],
    },
}


def die(msg):
    print(f"anchor_bench: {msg}", file=sys.stderr)
    sys.exit(1)


def llama_bench(bindir, model, threads, extra):
    cmd = [f"{bindir}/llama-bench", "-m", model, "-t", str(threads), "-r", "1", "-o", "json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    try:
        rows = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        die(f"{' '.join(cmd)}: output is not JSON ({e})")
    if len(rows) != 1:
        die(f"{' '.join(cmd)}: expected one test, got {len(rows)}")
    return rows[0]


def round_(engine, bindir, model, threads, pp, tg):
    if engine not in ENGINES:
        die(f"unknown engine '{engine}' (known: {', '.join(ENGINES)})")
    e = ENGINES[engine]
    p = llama_bench(bindir, model, threads, e["pp"](pp, tg))
    g = llama_bench(bindir, model, threads, e["tg"](pp, tg))
    # ik's -gp reports tokens/s of the tg part only; mainline's -d likewise times only n_gen.
    print(json.dumps({"engine": engine, "model": model, "threads": threads, "pp": pp, "tg": tg,
                      "size_bytes": p["model_size"], "n_params": p["model_n_params"],
                      "commit": p.get("build_commit"), "pp_tps": p["avg_ts"], "tg_tps": g["avg_ts"]}))


def stat(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def merge_hearth(out, paths):
    rounds = []
    for path in paths:
        with open(path) as f:
            rounds.append(json.load(f))
    if not rounds:
        die("merge-hearth: no round files")
    merged = dict(rounds[0])
    merged["reps"] = len(rounds)
    merged["rounds"] = "alternating with the anchors, one repetition each"
    runs = []
    for i, r0 in enumerate(rounds[0]["runs"]):
        run = dict(r0)
        for key in ("pp_tps", "tg_tps", "tg_gbs", "probe_paired_gbs", "tg_pct_paired"):
            if key in r0:
                run[key] = stat([r["runs"][i][key]["median"] for r in rounds])
        runs.append(run)
    merged["runs"] = runs
    with open(out, "w") as f:
        json.dump(merged, f, indent=1)


def merge_anchors(path):
    by = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                by.setdefault((r["engine"], r["model"]), []).append(r)
    # Size and parameter count per file: the smallest any engine reports. ik_llama.cpp gives a
    # tied embedding its own output copy and counts it twice; the file holds it once.
    size, params = {}, {}
    for (engine, model), rs in by.items():
        size[model] = min(size.get(model, rs[0]["size_bytes"]), rs[0]["size_bytes"])
        params[model] = min(params.get(model, rs[0]["n_params"]), rs[0]["n_params"])
    for (engine, model), rs in by.items():
        r0 = rs[0]
        print(json.dumps({"engine": engine, "model": model, "threads": r0["threads"],
                          "size_bytes": size[model], "n_params": params[model],
                          "bpw": 8 * size[model] / params[model], "commit": r0["commit"],
                          "reps": len(rs), "pp": r0["pp"], "tg": r0["tg"],
                          "pp_tps": stat([r["pp_tps"] for r in rs]),
                          "tg_tps": stat([r["tg_tps"] for r in rs])}))


def main(argv):
    if len(argv) >= 8 and argv[1] == "round":
        round_(argv[2], argv[3], argv[4], int(argv[5]), int(argv[6]), int(argv[7]))
    elif len(argv) >= 4 and argv[1] == "merge-hearth":
        merge_hearth(argv[2], argv[3:])
    elif len(argv) == 3 and argv[1] == "merge-anchors":
        merge_anchors(argv[2])
    else:
        die("usage: round ENGINE BIN_DIR MODEL THREADS PP TG | merge-hearth OUT ROUND.json... | "
            "merge-anchors ROUNDS.jsonl")


if __name__ == "__main__":
    main(sys.argv)
