#!/usr/bin/python3
"""Writes a benchmark's results into its document, between marker comments, so the numbers in
doc/ are always the last `make bench` run's and never retyped by hand.

usage: bench/doc_tables.py KIND DOC RESULT
  speed     RESULT = bench/run.sh's result directory (hearth_*.json, llama.json)
  serving   RESULT = `hearth bench --json` output (lines that are not JSON are skipped)
  memory    RESULT = `bench_memory --json` output (the ledger JSON line, then the PASS/FAIL lines)
  fidelity  RESULT = a directory of bench/fidelity and bench/fidelity_llama --json files
  fidelity-trained  RESULT = the same from bench/bench_fidelity_trained.sh (trained model)
  fidelity-trained-large  RESULT = the same for the larger trained model
  train     RESULT = bench/train's output directory (the train.py log of each model, *.log)
  kernels   RESULT = bench/bench_kernels output
  grammar   RESULT = bench/grammar_speed.sh's result directory (masks.txt, hearth.json, llama.json)
  openai    RESULT = bench/openai_compare.sh output (one JSON line per round)
  imatrix-self  RESULT = bench/bench_imatrix_self.sh output (one JSON line per model)

A kind owns one or more sections of DOC, each between `<!-- bench:NAME begin -->` and
`<!-- bench:NAME end -->` on lines of their own; only what lies between them is replaced.
A section missing from DOC (or present twice) is an error and DOC is left as it was.
The tables are also printed, so a run shows what it wrote.
"""
import json
import os
import re
import sys


def die(msg):
    print(f"doc_tables: {msg}", file=sys.stderr)
    sys.exit(1)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        die(f"{path}: {e}")


def json_lines(path):
    """The JSON objects of a file whose other lines are a tool's chatter."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError as e:
                        die(f"{path}:{n}: {e}")
    except OSError as e:
        die(f"{path}: {e}")
    return out


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def num(v, digits):
    return "-" if v is None else f"{v:.{digits}f}"


def stat(s, digits):
    """median (min-max); the median alone when there is no spread to show."""
    if s is None:
        return "-"
    if s.get("min") is None or s.get("max") is None or s["min"] == s["max"]:
        return num(s["median"], digits)
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def pct_stat(s):
    """96 % (85-107 %), or 96 % without a spread."""
    if not s:
        return "-"
    lo, hi = s.get("min"), s.get("max")
    if lo is None or hi is None or round(lo) == round(hi):
        return f"{s['median']:.0f} %"
    return f"{s['median']:.0f} % ({lo:.0f}-{hi:.0f} %)"


def file_tag(model):
    """qwen3-1.7b-q4_k_m.gguf -> q4_k_m: the part that says what the file holds."""
    m = re.search(r"-([A-Za-z0-9_]+)\.gguf$", os.path.basename(model))
    return m.group(1) if m else os.path.basename(model)


# ---- speed: hearthd-tool bench against llama.cpp (bench/run.sh)

SPEED_OURS = ["hearth_bf16.json", "hearth_bf16_g32.json", "hearth_bf16_g32_q8.json",
              "hearth_q4_0.json", "hearth_gemma3_q4_0.json"]


def family(model):
    """qwen3-1.7b-q4_k_m.gguf -> qwen3-1.7b: the model a file is of."""
    base = os.path.basename(model)
    return base[:-len(file_tag(model)) - 6] if base.endswith(f"-{file_tag(model)}.gguf") else base


def kv_read(o, pp, tg):
    """KV bytes tg decode tokens after pp positions read, by hearth's figures for the model:
    every position on global layers, the last `window` on sliding ones."""
    glob, slid, w = o["kv_bytes_per_pos"], o.get("kv_sliding_bytes_per_pos", 0), o.get("window", 0)
    return sum((pp + i + 1) * glob + min(pp + i + 1, w) * slid for i in range(tg))


def speed(res):
    ours = [read_json(os.path.join(res, f)) for f in SPEED_OURS if os.path.exists(os.path.join(res, f))]
    llama = [r for r in json_lines(os.path.join(res, "llama.json")) if not r.get("error")] \
        if os.path.exists(os.path.join(res, "llama.json")) else []
    if not ours or not llama:
        die(f"{res}: needs hearth_bf16.json and llama.json")
    probe = next((o["probe_gbs"] for o in ours if o.get("probe_gbs")), None)
    main = family(ours[0]["model"])
    # another model's rows say which model they are of
    label = lambda model, tag: tag if family(model) == main else f"{family(model)} {tag}"
    pp, tg = ours[0]["pp"], ours[0]["tg"]
    pct = lambda g: f"{100 * g / probe['median']:.0f} %" if probe else "-"
    rows = []
    for o in ours:
        for r in o["runs"]:
            paired = r.get("tg_pct_paired")
            rows.append([f"hearth {'W4A8' if r['act'] == 'a8' else 'W4A16'}",
                         label(o["model"], f"{file_tag(o['model'])} / {o['layout']}"), num(o["bpw"], 2),
                         stat(r["pp_tps"], 1), stat(r["tg_tps"], 2), num(r["tg_gbs"]["median"], 1),
                         pct(r["tg_gbs"]["median"]),
                         pct_stat(paired)])
    for l in llama:
        # llama.cpp's decode reads about its whole model per token (the tied head is token_embd).
        same_model = next((o for o in ours if family(o["model"]) == family(l["model"])), ours[0])
        kv = kv_read(same_model, l["pp"], l["tg"])
        gbs = (l["tg"] * l["size_bytes"] + kv) / (l["tg"] / l["tg_tps"]["median"]) * 1e-9
        rows.append([l.get("engine", "llama.cpp"), label(l["model"], file_tag(l["model"]).upper()), num(l["bpw"], 2),
                     stat(l["pp_tps"], 1), stat(l["tg_tps"], 2), num(gbs, 1), pct(gbs), "-"])
    text = table(["engine", "file / layout", "bpw", f"pp{pp} tok/s", f"tg{tg} tok/s",
                  "decode GB/s", "% probe", "% paired"], rows)
    notes = []
    if probe:
        notes.append(f"Stream probe at start-up: median {probe['median']:.1f} GB/s "
                     f"(min {probe['min']:.1f}, max {probe['max']:.1f}).")
    run = lambda o, act: next((r for r in o["runs"] if r["act"] == act), None)
    # Each anchor's Q4_0 against hearth on the same Q4_0 file when that was measured in the
    # same rounds, and against hearth's default (the BF16 file at group 128).
    for q40 in (l for l in llama if re.search(r"q4_0", l["model"], re.I)):
        same = next((o for o in ours if os.path.basename(o["model"]) == os.path.basename(q40["model"])),
                    None)
        for o in (same, ours[0] if family(q40["model"]) == main else None):
            if o is None:
                continue
            parts = []
            for what, key, act in (("decode W4A8", "tg_tps", "a8"), ("decode W4A16", "tg_tps", "a16"),
                                   ("pp W4A8", "pp_tps", "a8"), ("pp W4A16", "pp_tps", "a16")):
                r = run(o, act)
                if r:
                    parts.append(f"{what} {r[key]['median'] / q40[key]['median']:.2f}x")
            notes.append(f"Ratios to {q40.get('engine', 'llama.cpp')} {label(q40['model'], 'Q4_0')} "
                         f"(hearth {label(o['model'], file_tag(o['model']))} / {o['layout']}, medians): "
                         + ", ".join(parts) + ".")
    return {"speed": text + "\n\n" + " ".join(notes)}


# ---- serving: hearth bench against a running hearthd (bench/serve_bench.sh)

def serving(path):
    objs = [o for o in json_lines(path) if "levels" in o]
    if not objs:
        die(f"{path}: no `hearth bench --json` result in it")
    b = objs[-1]
    rows = []
    for lv in b["levels"]:
        g = lambda k, d: num(lv.get(k), d)
        rows.append([lv["clients"], g("aggregate_tps", 1),
                     f"{g('client_tps_mean', 1)} / {g('client_tps_min', 1)}", g("decode_tps_mean", 1),
                     g("steady_tps", 1), f"{g('ttft_ms_p50', 0)} / {g('ttft_ms_p99', 0)}",
                     f"{g('ipc_us_p50', 0)} / {g('ipc_us_p99', 0)} / {g('ipc_us_max', 0)}"])
    text = table(["clients", "agg tok/s", "client tok/s mean / min", "decode tok/s", "steady tok/s",
                  "TTFT p50 / p99 ms", "IPC p50 / p99 / max µs"], rows)
    notes = []
    if b.get("ratio_8_1") is not None:
        notes.append(f"aggregate(8) / aggregate(1) = {b['ratio_8_1']:.2f}x.")
    if b.get("wake_same_cpu_us_p50") is not None:
        notes.append(f"Wake floor in the same run: same cpu p50 {b['wake_same_cpu_us_p50']:.1f} / "
                     f"p99 {b['wake_same_cpu_us_p99']:.1f} µs, other cpu p50 "
                     f"{num(b.get('wake_other_cpu_us_p50'), 1)} / p99 "
                     f"{num(b.get('wake_other_cpu_us_p99'), 1)} µs.")
    return {"serving": text + ("\n\n" + " ".join(notes) if notes else "")}


# ---- memory: bench_memory's ledger and targets (bench/bench_memory.sh)

MIB = 1 << 20


def mib(v):
    return f"{v / MIB:.1f} MiB" if v >= MIB else f"{v / 1024:.0f} KiB"


def memory(path):
    led = next((o for o in json_lines(path) if "entries" in o), None)
    if led is None:
        die(f"{path}: no ledger JSON line (run bench_memory with --json)")
    targets = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"(PASS|FAIL)  (.{44}) (.*)$", line.rstrip("\n"))
            if m:
                targets.append([m.group(2).strip(), m.group(3), "met" if m.group(1) == "PASS" else "**missed**"])
    if not targets:
        die(f"{path}: no PASS/FAIL target lines")
    rows = [[e["name"], mib(e["bytes"]), mib(e["resident"])]
            for e in led["entries"] if e["bytes"] or e["resident"]]
    rows.append(["**total (ledger) / VmRSS + hugetlb**", "",
                 f"**{mib(led['total_resident'])} / {mib(led['process_resident'])}**"])
    return {"memory": table(["target", "measured", "result"], targets),
            "memory-ledger": table(["entry", "reserved", "resident"], rows)}


# ---- fidelity: bench/fidelity and bench/fidelity_llama (bench/bench_fidelity.sh)

# What each ablation of bench/fidelity swaps into the f32 engine, in the doc's words.
ABLATIONS = {
    "int4 all, f32 act": "all int4 (= W4A16 without activation rounding)",
    "int4 layers only": "int4 layers, exact embedding/head",
    "int4 embd/head only": "int4 embedding/head, exact layers",
    "int4 layers+q8 head": "int4 layers, Q8_0 embedding/head",
    "int4 g32 layers+q8 head": "int4 group 32 asym layers, Q8_0 embedding/head",
    "sim g64a L, g128a H": "*simulated:* group 64 asym layers, group 128 embedding/head",
    "sim g64a L+H": "*simulated:* group 64 asym everywhere",
    "sim g32 Q4_0 rule L+H": "*simulated:* group 32 sym, llama.cpp's Q4_0 rule, everywhere",
    "sim g32 sym search L+H": "*simulated:* group 32 sym with a scale search, everywhere",
    "sim g64a L, q8 H": "*simulated:* group 64 asym layers, Q8_0 embedding/head",
    "int4 layers+q6 head": "int4 layers, int6 embedding/head",
    "sim Q4_K L, g32a H": "*simulated:* Q4_K's layout (group 32 asym, 6-bit scales) layers, group 32 asym embedding/head",
    "sim Q4_K L, q6 H": "*simulated:* Q4_K's layout layers, int6 embedding/head",
    "sim Q4_K g64 L, q6 H": "*simulated:* the same at group 64 (4.31 bits), int6 embedding/head",
    "sim Q4_K g64 L, q6 H, mix": "*simulated:* the same, the first layer's attn_v and attn_k Q8_0",
    "sim g128a L, q6 H": "*simulated:* group 128 asym layers (fp16 scales), int6 embedding/head",
    "sim g64a L, q6 H": "*simulated:* group 64 asym layers (fp16 scales), int6 embedding/head",
    "sim g64 row8 L, q6 H": "*simulated:* group 64 row8 layers (8-bit scale codes), int6 embedding/head",
    "sim g128a L calib, q6 H": "*simulated:* group 128 asym layers weighted by calibration statistics, int6 embedding/head",
    "sim g64 row8 L calib, q6 H": "*simulated:* group 64 row8 layers weighted by calibration statistics, int6 embedding/head",
    "sim Q4_K g64 L calib, q6 H": "*simulated:* Q4_K's layout at group 64 weighted by calibration statistics, int6 embedding/head",
}


def kl(v):
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if v >= 0.1:
        return f"{v:.3f}"
    if v >= 0.001:
        return f"{v:.3g}"
    text = f"{v:.6f}".rstrip("0")
    return "< 1e-6" if text == "0." else text


def model_label(name):
    """fx-quant-f16.gguf -> fx-quant-f16; the benchmark's own prefix (hearth-fidelity-) goes."""
    return re.sub(r"^hearth-[a-z]+-", "", name.removesuffix(".gguf"))


def fidelity(res):
    try:
        files = sorted(f for f in os.listdir(res) if f.endswith(".json"))
    except OSError as e:
        die(f"{res}: {e}")
    if not files:
        die(f"{res}: no result files")
    models, by_model = [], {}
    for f in files:
        o = read_json(os.path.join(res, f))
        if o["model"] not in by_model:
            models.append(o["model"])
            by_model[o["model"]] = []
        by_model[o["model"]].append(o)
    rows, abl_rows, abl_models = [], {}, []
    for name in models:
        for o in by_model[name]:
            for b in o["builds"]:
                if "q4_0_source" in o:
                    label = "llama.cpp Q4_0" + (" `--pure`" if "pure" in o["q4_0_source"] else "")
                    label += f" ({b.get('types', '')})"
                else:
                    label = f"hearth {b['build'].upper()} ({b['quant']})"
                rows.append([f"{model_label(name)} ({o['positions']})", label, num(b.get("bpw"), 2),
                             num(b.get("top1"), 3), kl(b.get("kl_mean")), kl(b.get("kl_p99")),
                             kl(b.get("kl_max"))])
            if "ablations" in o:
                abl_models.append(model_label(name))
                for a in o["ablations"] + [dict(a, weights=f"activation rounding alone, {a['build'].upper()}")
                                           for a in o.get("activation_only", [])]:
                    cell = f"{kl(a.get('kl_mean'))} ({num(a.get('top1'), 2)})"
                    abl_rows.setdefault(a["weights"], {})[abl_models[-1]] = cell
    out = {"fidelity": table(["model (positions)", "build", "bpw", "top-1", "KL mean", "KL p99", "KL max"],
                             rows)}
    if abl_rows:
        out["fidelity-ablation"] = table(
            ["weights in the f32 engine"] + abl_models,
            [[ABLATIONS.get(w, w)] + [cells.get(m, "-") for m in abl_models] for w, cells in abl_rows.items()])
    return out


def fidelity_trained(res):
    """One row per build of the trained model, with the greedy exact-reproduction count."""
    try:
        files = sorted(f for f in os.listdir(res) if f.endswith(".json"))
    except OSError as e:
        die(f"{res}: {e}")
    if not files:
        die(f"{res}: no result files")
    rows, check = [], None
    for f in files:
        o = read_json(os.path.join(res, f))
        for b in o["builds"]:
            if "q4_0_source" in o:
                label = f"{b['build']} ({b.get('types', '')})"
            else:
                label = f"hearth {b['build'].upper()} ({b['quant']})"
                if o.get("label"):
                    label += f", {o['label']}"
            greedy = (f"{b['greedy_exact']}/{b['greedy_prompts']}" if "greedy_exact" in b else "-")
            rows.append([label, num(b.get("bpw"), 2), num(b.get("top1"), 3), kl(b.get("kl_mean")),
                         kl(b.get("kl_p99")), kl(b.get("kl_max")), greedy])
        if "check_vs_hearth_f32" in o:
            check = o["check_vs_hearth_f32"]
        positions = o["positions"]
    head = ["build", "bpw", "top-1", "KL mean", "KL p99", "KL max", "greedy exact"]
    text = f"{positions} held-out positions.\n\n" + table(head, rows)
    if check:
        text += (f"\n\nllama.cpp unquantized against hearth's f32 reference on the same positions: "
                 f"top-1 {num(check.get('top1'), 4)}, KL mean {kl(check.get('kl_mean'))}, "
                 f"max {kl(check.get('kl_max'))}.")
    return {"fidelity-trained": text}


def fidelity_trained_large(res):
    return {"fidelity-trained-large": fidelity_trained(res)["fidelity-trained"]}


# ---- train: bench/train/train.py's logs

TRAIN_MODEL = re.compile(r"^model: llama dim (\d+) layers (\d+) heads (\d+)/(\d+) ff (\d+) vocab (\d+) "
                         r"seq (\d+): ([0-9.]+)M params")
TRAIN_STEP = re.compile(r"^step (\d+)/(\d+) ")
TRAIN_HELD = re.compile(r"^held-out: (\d+) positions, loss ([0-9.]+) nats/token, perplexity ([0-9.]+), "
                        r"median top-token probability ([0-9.]+)")
TRAIN_WALL = re.compile(r"^train: (\d+) s wall")


def train(res):
    """One row per trained model (the logs train.py printed), then each one's greedy text."""
    try:
        logs = sorted(f for f in os.listdir(res) if f.endswith(".log"))
    except OSError as e:
        die(f"{res}: {e}")
    rows, samples = [], []
    for f in logs:
        shape = held = wall = steps = None
        greedy = []
        with open(os.path.join(res, f), encoding="utf-8") as fh:
            for line in fh:
                line = line.rstrip("\n")
                m = TRAIN_MODEL.match(line)
                shape = m.groups() if m else shape
                m = TRAIN_STEP.match(line)
                steps = m.group(2) if m else steps
                m = TRAIN_HELD.match(line)
                held = m.groups() if m else held
                m = TRAIN_WALL.match(line)
                wall = m.group(1) if m else wall
                if line.startswith("greedy: "):
                    greedy.append(line[len("greedy: "):])
        if not (shape and held and wall):
            continue  # not a finished train.py run
        name = f[:-len(".log")]
        dim, layers, heads, kv, ff, vocab, seq, params = shape
        rows.append([name, f"{params}M", f"{dim} x {layers}, {heads}/{kv} heads, ff {ff}", steps,
                     f"{wall} s", f"{float(held[1]):.3f}", f"{float(held[2]):.1f}", f"{float(held[3]):.3f}"])
        samples.append(f"{name}, greedy, 40 tokens:\n\n" + "\n".join(f"- {g}" for g in greedy))
    if not rows:
        die(f"{res}: no finished train.py log")
    text = table(["model", "params", "shape (dim x layers, heads, SwiGLU)", "steps", "train wall",
                  "held-out loss (nats/token)", "perplexity", "median top-token probability"], rows)
    return {"train": text + "\n\n" + "\n\n".join(samples)}


# ---- kernels: bench/bench_kernels

def kernels(path):
    rows, order, shape, head = {}, [], None, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("kernels "):
                head = line.split(",")[0]
            m = re.match(r"stream read\s+(\d) thr: +([\d.]+) GB/s wall", line)
            if m:
                key = "plain streaming read"
                if key not in rows:
                    order.append(key)
                rows.setdefault(key, {})[m.group(1)] = f"{m.group(2)} GB/s"
                continue
            m = re.match(r"(\d+x\d+) \(", line)
            if m:
                shape = m.group(1)
                continue
            m = re.match(r"\s+(gemv|gemm) (W4A\d+)\s*(\d) thr: +([\d.]+) (GB|GOP)/s wall(.*)$", line)
            if m and shape:
                kind, act, thr, val, unit, rest = m.groups()
                t = re.search(r"\((\d+) tokens", rest)
                what = "GEMV" if kind == "gemv" else f"GEMM {t.group(1)} tok" + \
                    (" from memory" if "from memory" in rest else "")
                key = f"{what} {act} {shape}"
                if key not in rows:
                    order.append(key)
                rows.setdefault(key, {})[thr] = f"{val} {unit}/s"
    if not rows:
        die(f"{path}: no bench_kernels lines")
    text = table(["measurement", "1 thread", "2 threads"],
                 [[k, rows[k].get("1", "-"), rows[k].get("2", "-")] for k in order])
    return {"kernels": (f"{head}, wall-clock rates.\n\n" if head else "") + text}


# ---- grammar: structured output's cost (bench/grammar_speed.sh)

def med(v):
    s = sorted(v)
    n = len(s)
    if not n:
        return None
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def spread(v, digits, suffix=""):
    """median (min-max) of a list."""
    if not v:
        return "-"
    return f"{med(v):.{digits}f}{suffix} ({min(v):.{digits}f}-{max(v):.{digits}f}{suffix})"


def grammar(res):
    h = read_json(os.path.join(res, "hearth.json"))
    ll = read_json(os.path.join(res, "llama.json"))
    tps = lambda runs: [r["decode_tps"] for r in runs]  # noqa: E731
    hr = h["runs"]
    rows = [["hearth", spread(tps(hr["plain"]), 2), spread(tps(hr["schema"]), 2), spread(h["ratio_schema"], 3, "x")],
            ["hearth, jump-forward on", spread(tps(hr["plain"]), 2), spread(tps(hr["schema_jump"]), 2),
             spread(h["ratio_schema_jump"], 3, "x")],
            ["llama.cpp", spread(tps(ll["runs"]["plain"]), 2), spread(tps(ll["runs"]["schema"]), 2),
             spread(ll["ratio_schema"], 3, "x")]]
    speed_text = table(["engine", "unconstrained tok/s", "10-property schema tok/s",
                        "schema / unconstrained, per round"], rows)
    speed_text += (f"\n\n{h['rounds']} alternating rounds of {h['tokens']} greedy tokens each; "
                   f"median (min-max) over the rounds.")
    jrows = []
    for kind, label in (("long_keys", "without jump-forward"), ("long_keys_jump", "with jump-forward")):
        runs = hr[kind]
        jrows.append([label, f"{med([r['n_gen'] for r in runs]):.0f}", f"{med([r['n_forced'] for r in runs]):.0f}",
                      spread(tps(runs), 2), spread([r["ms"] for r in runs], 0),
                      spread([r["bytes"] / (r["ms"] / 1e3) for r in runs], 1)])
    jump_text = table(["long-keys schema, hearth", "tokens", "of them forced", "tokens/s",
                       "ms per request", "output bytes/s"], jrows)
    mrows = []
    name = None
    with open(os.path.join(res, "masks.txt"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"schema (\S+\.json)$", line)
            if m:
                name = m.group(1)
                compile_ms = None
                continue
            m = re.match(r"schema -> grammar -> token index: best ([\d.]+) ms", line)
            if m:
                compile_ms = float(m.group(1))
                continue
            m = re.match(r"fill_mask .* over (\d+) steps.*p50 ([\d.]+), p90 [\d.]+, p99 ([\d.]+), max ([\d.]+) ms",
                         line)
            if m and name:
                mrows.append([name, num(compile_ms, 1), m.group(1), f"{float(m.group(2)) * 1e3:.0f}",
                              f"{float(m.group(3)) * 1e3:.0f}", f"{float(m.group(4)):.2f}"])
    if not mrows:
        die(f"{res}/masks.txt: no bench_grammar results")
    mask_text = table(["schema", "compile + index ms", "mask steps", "p50 µs", "p99 µs", "max ms"], mrows)
    return {"grammar": speed_text, "grammar-jump": jump_text, "grammar-masks": mask_text}


# ---- openai: the gateway against libhearth and llama-server (bench/openai_compare.sh)

def openai(path):
    """Rounds of bench/openai_compare.sh: per contender the median aggregate tok/s and the
    range; then the ratios that the goals name, taken round by round (each round runs the
    contenders back to back) and summarised by their median and range."""
    rounds = json_lines(path)
    if not rounds:
        die(f"{path}: no rounds")
    names = [("libhearth", "libhearth (`hearth bench --clients 8`)"),
             ("gateway", "hearth-openai, streaming /v1/chat/completions"),
             ("llama_mainline", "llama-server `--parallel 8`, mainline llama.cpp"),
             ("llama_ik", "llama-server `--parallel 8`, ik_llama.cpp")]
    names = [(k, label) for k, label in names if all(k in r for r in rounds)]

    def cell(v, digits, unit=""):
        return f"{med(v):.{digits}f}{unit} ({min(v):.{digits}f}-{max(v):.{digits}f})"

    rows = [[label, cell([r[k] for r in rounds], 1)] for k, label in names]
    ratios = []
    if "gateway" in rounds[0]:
        ratios.append(["hearth-openai / libhearth", cell([r["gateway"] / r["libhearth"] for r in rounds], 2, "x"),
                       "≥ 0.95x"])
        for k, label in names:
            if k.startswith("llama_"):
                anchor = "mainline llama.cpp" if k == "llama_mainline" else "ik_llama.cpp"
                ratios.append([f"hearth-openai / llama-server ({anchor})",
                               cell([r["gateway"] / r[k] for r in rounds], 2, "x"), "≥ 2x"])
    r0 = rounds[0]
    head = (f"{len(rounds)} alternating rounds, {r0['streams']} concurrent streams, {r0['tokens']} tokens "
            f"generated each, {r0['threads']} compute threads per server; median (lowest-highest).")
    text = head + "\n\n" + table(["through", "aggregate tok/s"], rows)
    if ratios:
        text += "\n\n" + table(["ratio, round by round", "median (range)", "goal"], ratios)
    return {"openai": text}


# ---- spec: speculative decoding per workload (bench/spec_bench.sh)

SPEC_MODELS = (("kjv", "demo model (2.9M, trained, Q8_0)"), ("qwen3-1.7b", "Qwen3-1.7B shape, Q4_0 (random weights)"))


def spec(res):
    rows = []
    meta = None
    for tag, label in SPEC_MODELS:
        path = os.path.join(res, f"hearth-{tag}.json")
        if not os.path.exists(path):
            continue
        h = read_json(path)
        meta = meta or h
        for name, runs in h["runs"].items():
            off = [r["decode_tps"] for r in runs["off"]]
            on = [r["decode_tps"] for r in runs["on"]]
            drafted = sum(r["drafted"] for r in runs["on"])
            accepted = sum(r["accepted"] for r in runs["on"])
            rate = f"{100.0 * accepted / drafted:.0f} % of {drafted}" if drafted else "no draft"
            rows.append([label, name, spread(off, 1), spread(on, 1),
                         spread([b / a for a, b in zip(off, on)], 2, "x"), rate,
                         "yes" if h["same_output"][name] else "**no**"])
    if not rows:
        die(f"{res}: no hearth-*.json results")
    text = table(["model", "workload", "drafts off tok/s", "drafts on tok/s", "on / off, per round",
                  "drafts accepted", "same tokens"], rows)
    text += (f"\n\n{meta['rounds']} alternating rounds of {meta['tokens']} tokens each; decode tok/s as "
             "the daemon reports it (done.decode_tps); median (min-max) over the rounds.")
    text += ik_spec_table(os.path.join(res, "ik.json"), "Qwen3-1.7B shape Q4_0", "lookup")
    text += spec_draft(res)
    return {"spec": text}


SPEC_DRAFT_PAIRS = (("draft-kjv-self", "demo model, itself as draft"),
                    ("draft-target", "larger trained target, demo model as draft"),
                    ("draft-qwen3-1.7b", "Qwen3-1.7B shape Q4_0, tiny random draft"))


def ik_spec_table(path, label, tool):
    """ik_llama.cpp's llama-simple against its llama-TOOL (runs[name]["plain"], [tool],
    ["accept"]), or "" without results. A label with {model} and {draft} takes the files'
    names the results give."""
    if not os.path.exists(path):
        return ""
    k = read_json(path)
    label = label.format(model=k.get("model") or "?", draft=k.get("draft") or "?")
    rows = [[name, spread(r["plain"], 1), spread(r[tool], 1),
             spread([b / a for a, b in zip(r["plain"], r[tool])], 2, "x"),
             spread(r["accept"], 0, " %") if r["accept"] else "-"]
            for name, r in k["runs"].items()]
    return "\n\n" + table([f"ik_llama.cpp, {label}", "llama-simple tok/s", f"llama-{tool} tok/s",
                            f"{tool} / simple", "drafts accepted"], rows)


def accepted_of(runs, d, a):
    drafted = sum(r[d] for r in runs)
    return f"{100.0 * sum(r[a] for r in runs) / drafted:.0f} % of {drafted}" if drafted else "no draft"


SPEC_ANCHOR_NAMES = {"ik_llama.cpp": "ik_llama.cpp llama-server", "llama.cpp": "mainline llama.cpp llama-server"}


def spec_draft(res):
    """The draft-model table (modes off, lookup, model, auto), and the anchors' table: per pair
    and workload, hearth's off and model modes beside each anchor's llama-server without and
    with the same draft model, run in the same alternating rounds."""
    rows, anchor_rows, setups = [], [], {}
    for tag, label in SPEC_DRAFT_PAIRS:
        path = os.path.join(res, f"hearth-{tag}.json")
        if not os.path.exists(path):
            continue
        h = read_json(path)
        for name, runs in h["runs"].items():
            tps = {m: [r["decode_tps"] for r in runs[m]] for m in runs}
            digits = 0 if med(tps["off"]) >= 100 else 1
            rows.append([label, name, *(spread(tps[m], digits) for m in ("off", "lookup", "model", "auto")),
                         spread([b / a for a, b in zip(tps["off"], tps["model"])], 2, "x"),
                         accepted_of(runs["model"], "model_drafted", "model_accepted"),
                         accepted_of(runs["lookup"], "drafted", "accepted"),
                         "yes" if h["same_output"][name] else "**no**"])
            anchors = h.get("anchors", {})
            if not anchors:
                continue
            anchor_rows.append([label, name, "hearth (`draft` model)", spread(tps["off"], digits),
                                spread(tps["model"], digits),
                                spread([b / a for a, b in zip(tps["off"], tps["model"])], 2, "x"),
                                accepted_of(runs["model"], "model_drafted", "model_accepted"),
                                "yes" if h["same_output"][name] else "**no**", "-"])
            for engine, a in anchors.items():
                wait = f", OMP_WAIT_POLICY={a['omp_wait']}" if a.get("omp_wait") not in (None, "default") else ""
                setups[engine] = (f"{SPEC_ANCHOR_NAMES.get(engine, engine)}: `{a['draft_options']}`, "
                                  f"{a['threads']} threads, context {a['ctx']}{wait}")
                plain = [r["decode_tps"] for r in a["runs"][name]["plain"]]
                draft = [r["decode_tps"] for r in a["runs"][name]["draft"]]
                anchor_rows.append([label, name, SPEC_ANCHOR_NAMES.get(engine, engine), spread(plain, digits),
                                    spread(draft, digits), spread([b / a for a, b in zip(plain, draft)], 2, "x"),
                                    accepted_of(a["runs"][name]["draft"], "drafted", "accepted"),
                                    "yes" if a["same_output"][name] else "**no**",
                                    spread([m / d for m, d in zip(tps["model"], draft)], 2, "x")])
    if not rows:
        return ""
    text = "\n\n" + table(["target, draft", "workload", "off tok/s", "lookup tok/s", "model tok/s", "auto tok/s",
                            "model / off", "model drafts accepted", "lookup drafts accepted",
                            "same tokens (all modes)"], rows)
    if anchor_rows:
        text += "\n\n" + table(["target, draft", "workload", "engine", "no draft tok/s", "draft model tok/s",
                                 "draft / no draft", "drafts accepted", "same output with draft",
                                 "hearth model / this draft"], anchor_rows)
        text += ("\n\nSame files, prompts and rounds for every engine, the order flipping every round; "
                 "tok/s of generation alone (hearth: done.decode_tps; llama-server: "
                 "timings.predicted_per_second), drafts from its timings.draft_n and draft_n_accepted; "
                 "the last column is hearth's model mode over the row's draft column, round by round. "
                 + "; ".join(setups[e] for e in sorted(setups)) + ".")
    return text


def imatrix_self(path):
    rows = []
    for r in json_lines(path):
        rows.append([f"{r['label']} (`{r['model']}`)", r["quant"], num(r["plain_s"], 1),
                     num(r["first_s"], 1), num(r["calib_s"], 1), num(r["cached_s"], 1),
                     num(r["plain_kept_s"], 1), num(r["self_kept_s"], 1),
                     mib(r["file_bytes"]), mib(r["weights_bytes"]), mib(r["plain_hwm_kib"] * 1024),
                     mib(r["first_hwm_kib"] * 1024), mib(r["cached_hwm_kib"] * 1024)])
    if not rows:
        die(f"{path}: no results")
    head = ["model", "layout with imatrix = self", "start, no imatrix (s)", "first start, self (s)",
            "of which the calibration (s)", "later start, self (s)",
            "later start, no imatrix, weights kept (s)", "later start, self, weights kept (s)",
            "imatrix file", "weights file (self)",
            "peak RSS, no imatrix", "peak RSS, first", "peak RSS, later"]
    return {"imatrix-self": table(head, rows)}


KINDS = {"speed": speed, "serving": serving, "memory": memory, "fidelity": fidelity,
         "fidelity-trained": fidelity_trained, "fidelity-trained-large": fidelity_trained_large,
         "train": train, "kernels": kernels, "grammar": grammar,
         "openai": openai, "spec": spec, "imatrix-self": imatrix_self}


def replace(doc, sections):
    try:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        die(f"{doc}: {e}")
    for name, body in sections.items():
        begin, end = f"<!-- bench:{name} begin -->\n", f"<!-- bench:{name} end -->"
        if text.count(begin) != 1 or text.count(end) != 1:
            die(f"{doc}: needs exactly one '{begin.strip()}' line and one '{end}' line")
        i = text.index(begin) + len(begin)
        j = text.index(end)
        if j < i:
            die(f"{doc}: '{end}' comes before '{begin.strip()}'")
        text = text[:i] + body.rstrip("\n") + "\n" + text[j:]
    tmp = f"{doc}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, doc)


def main(argv):
    if len(argv) != 4 or argv[1] not in KINDS:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    sections = KINDS[argv[1]](argv[3])
    replace(argv[2], sections)
    for name, body in sections.items():
        print(f"{argv[2]} [{name}]:\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
