"""The Python client against a real hearthd on the fx-qwen3 fixture: greedy output equal to
the daemon's own answer through the other path (ring vs socket frames, sync vs asyncio),
cancel, tokenize round trips, errors as HearthError with the daemon's code, and a dead
daemon seen as "closed"."""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import hearth

# Every scratch directory is removed whole at the end: hearthd leaves its socket's lock file
# behind by design (removing it would race a daemon starting on the same path).
_scratch = []


def scratch_dir():
    d = tempfile.mkdtemp(prefix="hearth-py.")
    _scratch.append(d)
    return d


@pytest.fixture(scope="session", autouse=True)
def _remove_scratch():
    yield
    for d in _scratch:
        shutil.rmtree(d, ignore_errors=True)


BUILD = os.environ.get("HEARTH_BUILDDIR", os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SHARED = os.environ.get("HEARTH_SHARED", os.path.join(BUILD, "..", "shared"))
MODEL = os.path.join(SHARED, "fixtures", "fx-qwen3.gguf")


def start_daemon(sock, *extra):
    proc = subprocess.Popen(
        [os.path.join(BUILD, "hearthd"), f"--model={MODEL}", f"--socket={sock}", "--max-context=256",
         "--kv-budget=4MiB", "--threads=2", "--log-level=warning", "--socket-mode=0600", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"hearthd exited: {proc.stderr.read().decode()}")
        if os.path.exists(sock):
            try:
                hearth.Client(sock, name="probe").close()
                return proc
            except hearth.HearthError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("hearthd never became ready")


@pytest.fixture(scope="module")
def daemon():
    if not os.path.exists(MODEL):
        pytest.fail(f"fixture {MODEL} is missing")
    d = scratch_dir()
    sock = os.path.join(d, "h.sock")
    proc = start_daemon(sock)
    yield sock
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)


def test_welcome_describes_the_fixture(daemon):
    with hearth.Client(daemon) as c:
        assert c.model["arch"] == "qwen3"
        assert c.model["n_vocab"] == 50257
        assert c._core.ring is not None


def test_greedy_generation_is_the_same_through_ring_and_socket_frames(daemon):
    with hearth.Client(daemon) as c:
        g1 = c.generate("Once upon a time", max_tokens=12, temperature=0, ignore_eos=True).wait()
        g2 = c.generate("Once upon a time", max_tokens=12, temperature=0, ignore_eos=True,
                        socket_tokens=True).wait()
    assert len(g1.tokens) == 12
    assert [t.id for t in g1.tokens] == [t.id for t in g2.tokens]
    assert g1.done["finish"] == "length" and g1.done["n_gen"] == 12
    assert g1.done["n_prompt"] > 0
    assert isinstance(g1.text(), str) and g1.text() == b"".join(t.text for t in g1.tokens).decode("utf-8", "replace")


def test_a_client_without_ring_gets_the_same_tokens(daemon):
    with hearth.Client(daemon, ring=False) as c:
        assert c._core.ring is None
        g = c.generate("Once upon a time", max_tokens=6, temperature=0, ignore_eos=True).wait()
    with hearth.Client(daemon) as c:
        ref = c.generate("Once upon a time", max_tokens=6, temperature=0, ignore_eos=True).wait()
    assert [t.id for t in g.tokens] == [t.id for t in ref.tokens]


def test_logprobs_and_top_alternatives_arrive_with_each_token(daemon):
    with hearth.Client(daemon) as c:
        g = c.generate("Hello", max_tokens=4, temperature=0, logprobs=True, top_logprobs=3,
                       ignore_eos=True).wait()
    for t in g.tokens:
        assert t.logprob is not None and t.logprob <= 0
        assert len(t.top) == 3
        assert t.top[0][0] == t.id  # greedy: the sampled token is the most likely one


def test_tokenize_detokenize_round_trip(daemon):
    with hearth.Client(daemon) as c:
        ids = c.tokenize("The quick brown fox", add_bos=False)
        assert ids and all(isinstance(i, int) for i in ids)
        assert c.detokenize(ids) == b"The quick brown fox"


def test_cancel_ends_a_long_generation_early(daemon):
    with hearth.Client(daemon) as c:
        g = c.generate("Tell me a story", max_tokens=200, temperature=0, ignore_eos=True)
        it = iter(g)
        next(it)
        g.cancel()
        for _ in it:
            pass
        assert g.done["finish"] == "cancel"
        assert g.done["n_gen"] < 200


def test_bad_request_is_a_hearth_error_with_the_daemons_code(daemon):
    with hearth.Client(daemon) as c:
        with pytest.raises(hearth.HearthError) as e:
            c.generate("x", max_tokens=4, top_p=0.0).wait()
        assert e.value.code == "bad_field"
        assert "top_p" in e.value.message
        c.ping()  # the connection survives a refused request
        with pytest.raises(TypeError):
            c.generate("x", temprature=0.5)


def test_speculate_changes_no_token_and_counts_its_drafts(daemon):
    prompt = "one two three four one two three four one two three"
    with hearth.Client(daemon) as c:
        s0 = c.stats()
        off = c.generate(prompt, max_tokens=40, temperature=0, ignore_eos=True, speculate=0).wait()
        on = c.generate(prompt, max_tokens=40, temperature=0, ignore_eos=True, speculate=8).wait()
        s1 = c.stats()
    assert [t.id for t in on.tokens] == [t.id for t in off.tokens]
    assert s1["draft_tokens"] > s0["draft_tokens"]
    assert s1["draft_accepted"] <= s1["draft_tokens"]


def test_draft_source_is_passed_and_checked(daemon):
    # This daemon has no draft model: every source drafts by lookup, and none is counted as
    # the model's; a source the protocol does not know is refused by name.
    prompt = "one two three four one two three four one two three"
    with hearth.Client(daemon) as c:
        off = c.generate(prompt, max_tokens=24, temperature=0, ignore_eos=True, speculate=0).wait()
        for source in ("auto", "lookup", "model"):
            g = c.generate(prompt, max_tokens=24, temperature=0, ignore_eos=True, draft=source).wait()
            assert [t.id for t in g.tokens] == [t.id for t in off.tokens]
        assert c.stats()["draft_model_tokens"] == 0
        with pytest.raises(hearth.HearthError) as e:
            c.generate(prompt, max_tokens=4, draft="oracle").wait()
        assert e.value.code == "bad_field"
        assert "draft" in e.value.message


def test_stats_count_this_client(daemon):
    with hearth.Client(daemon) as c:
        s = c.stats()
        assert s["clients"] >= 1
        assert s["kv_total"] > 0
        # no draft model: its KV reads as empty and the welcome names none
        assert s["draft_kv_used"] == 0 and s["draft_kv_total"] == 0
        assert "draft" not in c.model


def test_a_draft_model_is_named_and_its_kv_counted():
    # The fixture drafting for itself: the welcome names the draft, its KV pool is counted
    # apart from the model's and fills while it drafts, and model drafts change no token.
    d = scratch_dir()
    sock = os.path.join(d, "h.sock")
    proc = start_daemon(sock, f"--draft-model={MODEL}", "--draft-kv-budget=4MiB")
    try:
        with hearth.Client(sock) as c:
            assert c.model["draft"]["arch"] == "qwen3"
            assert c.model["draft"]["n_layer"] == c.model["n_layer"]
            s0 = c.stats()
            assert s0["draft_kv_total"] > 0 and s0["draft_kv_used"] == 0
            prompt = "Once upon a time"
            off = c.generate(prompt, max_tokens=16, temperature=0, ignore_eos=True, speculate=0).wait()
            g = c.generate(prompt, max_tokens=16, temperature=0, ignore_eos=True, draft="model").wait()
            assert [t.id for t in g.tokens] == [t.id for t in off.tokens]
            s1 = c.stats()
            assert s1["draft_model_tokens"] > 0
            assert s1["draft_model_accepted"] == s1["draft_model_tokens"]  # its own greedy drafts
            assert s1["draft_kv_total"] == s0["draft_kv_total"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_stats_prefix_counters_move_by_the_cached_tokens(daemon):
    prompt = " ".join(["river stone lamp orchard winter copper meadow harbor"] * 6)
    with hearth.Client(daemon) as c:
        s0 = c.stats()
        assert s0["phase"] == "ready"
        g1 = c.generate(prompt, max_tokens=2, temperature=0, ignore_eos=True).wait()
        s1 = c.stats()
        g2 = c.generate(prompt, max_tokens=2, temperature=0, ignore_eos=True).wait()
        s2 = c.stats()
    n = g1.done["n_prompt"]
    assert n > 32 and g2.done["n_prompt"] == n
    # The repeat is cached up to its last full 16-token KV block; its last token is always
    # computed, so its logits exist.
    assert g2.done.get("n_cached", 0) == min(n // 16 * 16, n - 1)
    assert s1["prefix_lookup_tokens"] - s0["prefix_lookup_tokens"] == n
    assert s1["prefix_hit_tokens"] - s0["prefix_hit_tokens"] == g1.done.get("n_cached", 0)
    assert s2["prefix_lookup_tokens"] - s1["prefix_lookup_tokens"] == n
    assert s2["prefix_hit_tokens"] - s1["prefix_hit_tokens"] == g2.done["n_cached"]


def test_asyncio_streams_two_generations_concurrently(daemon):
    async def run():
        c = await hearth.AsyncClient.connect(daemon)
        try:
            a = c.generate("Once upon a time", max_tokens=8, temperature=0, ignore_eos=True)
            b = c.generate("The sky is", max_tokens=8, temperature=0, ignore_eos=True)
            await asyncio.gather(a.wait(), b.wait())
            return [t.id for t in a.tokens], [t.id for t in b.tokens], await c.tokenize("hi", add_bos=False)
        finally:
            await c.close()

    ta, tb, ids = asyncio.run(run())
    with hearth.Client(daemon) as c:
        ra = c.generate("Once upon a time", max_tokens=8, temperature=0, ignore_eos=True).wait()
        rb = c.generate("The sky is", max_tokens=8, temperature=0, ignore_eos=True).wait()
        assert ids == c.tokenize("hi", add_bos=False)
    assert ta == [t.id for t in ra.tokens]
    assert tb == [t.id for t in rb.tokens]


def test_a_dead_daemon_is_reported_as_closed():
    d = scratch_dir()
    sock = os.path.join(d, "h.sock")
    proc = start_daemon(sock)
    try:
        c = hearth.Client(sock)
        g = c.generate("Once upon a time", max_tokens=200, temperature=0, ignore_eos=True)
        proc.kill()
        proc.wait()
        with pytest.raises(hearth.HearthError) as e:
            g.wait()
        assert e.value.code == "closed"
        c.close()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_connecting_to_nothing_says_where():
    with pytest.raises(hearth.HearthError) as e:
        hearth.Client("/nonexistent/hearth.sock")
    assert "/nonexistent/hearth.sock" in str(e.value)


# ---- chat (protocol 1.1) on a model carrying Qwen3's own template ----

@pytest.fixture(scope="module")
def chat_daemon():
    template = os.path.join(SHARED, "chat", "templates", "Qwen-Qwen3-0.6B.jinja")
    d = scratch_dir()
    model = os.path.join(d, "q3.gguf")
    subprocess.run([os.path.join(BUILD, "tests", "mkmodel"), "-o", model, "--arch", "qwen3", "--n-embd", "64",
                    "--n-layer", "2", "--n-head", "4", "--n-head-kv", "2", "--head-dim", "16", "--n-ff", "128",
                    "--chat-template", template], check=True, stdout=subprocess.DEVNULL)
    sock = os.path.join(d, "h.sock")
    proc = subprocess.Popen(
        [os.path.join(BUILD, "hearthd"), f"--model={model}", f"--socket={sock}", "--max-context=2048",
         "--kv-budget=32MiB", "--threads=2", "--log-level=warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not os.path.exists(sock):
        time.sleep(0.05)
    time.sleep(0.3)
    yield sock
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)


def test_chat_streams_deltas_that_add_up_to_the_message(chat_daemon):
    with hearth.Client(chat_daemon) as c:
        assert c.model["chat_template"] == "model"
        g = c.chat([{"role": "user", "content": "Hello there"}], max_tokens=12, temperature=0)
        text = "".join(d.text for d in g if isinstance(d, hearth.ChatDelta) and d.kind == "content")
        assert g.done["n_prompt"] > 5 and g.done["n_gen"] >= 1
        assert g.message["role"] == "assistant"
        assert text.strip() == g.message["content"]


def test_chat_with_required_tool_returns_a_structured_call(chat_daemon):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}]
    with hearth.Client(chat_daemon) as c:
        g = c.chat([{"role": "user", "content": "Weather in Paris?"}], tools=tools, tool_choice="required",
                   max_tokens=160, temperature=0.8, seed=3).wait()
    assert g.done["finish"] == "tool_calls"
    call = g.message["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)


def test_chat_json_schema_output_parses(chat_daemon):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    with hearth.Client(chat_daemon) as c:
        for seed in (1, 2):
            msg = {"role": "user", "content": "A number?"}
            gen = c.chat([msg], max_tokens=60, temperature=1, seed=seed, json_schema=json.dumps(schema)).wait()
            v = json.loads(gen.message["content"])
            assert set(v) == {"n"} and 0 <= v["n"] <= 9


def test_chat_naming_an_unknown_tool_is_bad_field(chat_daemon):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with hearth.Client(chat_daemon) as c:
        with pytest.raises(hearth.HearthError) as e:
            c.chat([{"role": "user", "content": "x"}], tools=tools, tool_choice="g", max_tokens=2).wait()
        assert e.value.code == "bad_field" and "'g'" in e.value.message
        c.ping()


async def _achat(sock):
    c = await hearth.AsyncClient.connect(sock)
    try:
        g = c.chat([{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0)
        kinds = [d.kind async for d in g if isinstance(d, hearth.ChatDelta)]
        return kinds, g.message
    finally:
        await c.close()


def test_asyncio_chat(chat_daemon):
    kinds, message = asyncio.run(_achat(chat_daemon))
    assert message["role"] == "assistant"
    assert all(k in ("content", "reasoning", "tool_call") for k in kinds)


# ---- prefix_share: whose cached prompts a request may find (a timing side channel) ----

def _prompt_as(sock, uid, prompt_ids):
    """Runs one generation as uid in a child process; returns (n_cached, ttft_s)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            if uid != os.getuid():
                os.setgid(uid)
                os.setuid(uid)
            c = hearth.Client(sock, name="share")
            t0 = time.monotonic()
            g = c.generate(tokens=prompt_ids, max_tokens=1, temperature=0)
            it = iter(g)
            next(it)
            ttft = time.monotonic() - t0
            for _ in it:
                pass
            os.write(w, json.dumps([g.done.get("n_cached", 0), ttft]).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def _share_daemon(share):
    d = scratch_dir()
    os.chmod(d, 0o755)
    sock = os.path.join(d, "h.sock")
    proc = subprocess.Popen(
        [os.path.join(BUILD, "hearthd"), f"--model={MODEL}", f"--socket={sock}", "--max-context=512",
         "--kv-budget=8MiB", "--threads=2", "--log-level=warning", "--socket-mode=0666",
         f"--prefix-share={share}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not os.path.exists(sock):
        time.sleep(0.05)
    time.sleep(0.3)
    return proc, sock


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second uid")
def test_prefix_cache_is_not_shared_across_uids_by_default():
    proc, sock = _share_daemon("uid")
    try:
        ids = list(range(1000, 1200))
        first = _prompt_as(sock, 0, ids)            # root fills the cache
        other = _prompt_as(sock, 65534, ids)        # nobody: must not hit root's blocks
        again = _prompt_as(sock, 0, ids)            # root again: hits its own
        print("n_cached/ttft: root %s, nobody %s, root again %s" % (first, other, again))
        assert first[0] == 0
        assert other[0] == 0
        assert again[0] >= 192
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second uid")
def test_prefix_share_all_shares_across_uids():
    proc, sock = _share_daemon("all")
    try:
        ids = list(range(2000, 2200))
        _prompt_as(sock, 0, ids)
        other = _prompt_as(sock, 65534, ids)
        assert other[0] >= 192
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- embeddings (protocol 1.4) --

SRC = os.environ.get("HEARTH_SRCDIR", os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EMBED_FX = os.path.join(SRC, "tests", "fixtures", "embed")


def _embed_refs(pooling):
    """llama.cpp's vectors of tests/fixtures/embed/inputs.txt: (texts, [(n_tokens, vector)])."""
    with open(os.path.join(EMBED_FX, "inputs.txt"), encoding="utf-8") as f:
        texts = f.read().split("\n")[:-1]
    with open(os.path.join(EMBED_FX, f"ref-q4_0-{pooling}.txt")) as f:
        lines = f.read().split("\n")
    n, _ = map(int, lines[0].split())
    refs = []
    for line in lines[1:1 + n]:
        v = line.split()
        nt = int(v[0])
        refs.append((nt, [float(x) for x in v[1 + nt:]]))
    return texts, refs


def _cosine(a, b):
    ab = sum(x * y for x, y in zip(a, b))
    return ab / (sum(x * x for x in a) * sum(y * y for y in b)) ** 0.5


@pytest.fixture(scope="module")
def embed_daemon():
    d = scratch_dir()
    model = os.path.join(d, "embed.gguf")
    subprocess.run([os.path.join(BUILD, "tests", "mkmodel"), "-o", model, "--arch", "qwen3", "--pooling", "last",
                    "--seed", "7", "--type", "q4_0"], check=True, stdout=subprocess.DEVNULL)
    sock = os.path.join(d, "h.sock")
    proc = subprocess.Popen(
        [os.path.join(BUILD, "hearthd"), f"--model={model}", f"--socket={sock}", "--max-context=512",
         "--kv-budget=8MiB", "--threads=2", "--log-level=warning", "--socket-mode=0600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(100):
        try:
            hearth.Client(sock, name="probe").close()
            break
        except hearth.HearthError:
            time.sleep(0.05)
    yield sock
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_embed_matches_llama_cpp(embed_daemon, pooling):
    texts, refs = _embed_refs(pooling)
    with hearth.Client(embed_daemon) as c:
        assert c.model["pooling"] == "last"
        e = c.embed(texts, pooling=pooling)
    assert e.pooling == pooling
    assert e.n_tokens == [nt for nt, _ in refs]
    worst = min(_cosine(v, ref) for v, (_, ref) in zip(e.vectors, refs))
    print(f"lowest cosine against llama.cpp ({pooling}): {worst:.7f}")
    assert worst >= 0.9995


def test_embed_tokens_batches_and_asyncio_agree_with_text(embed_daemon):
    texts, _ = _embed_refs("last")
    with hearth.Client(embed_daemon) as c:
        by_text = c.embed(texts)
        ids = [c.tokenize(t, add_bos=False) for t in texts]
        by_ids = c.embed(ids)
        one = c.embed(ids[1])
        many = c.embed([f"input {i}" for i in range(300)], pooling="mean")
        alone = c.embed("input 299", pooling="mean")

    async def run():
        async with await hearth.AsyncClient.connect(embed_daemon) as a:
            return await a.embed(texts)
    by_async = asyncio.run(run())
    assert by_text.pooling == "last"
    assert by_ids.vectors == by_text.vectors == by_async.vectors
    assert one.vectors == [by_text.vectors[1]]
    assert len(many.vectors) == 300 and many.vectors[299] == alone.vectors[0]
    assert by_text.total_tokens == sum(by_text.n_tokens)


def test_embed_refusals_name_the_problem_and_the_daemon_serves_on(embed_daemon, daemon):
    with hearth.Client(embed_daemon) as c:
        cases = [(dict(inputs=[""]), "bad_field"), (dict(inputs=[[1, 10 ** 6]]), "bad_token"),
                 (dict(inputs="a b " * 400), "context"), (dict(inputs="x", pooling="none"), "bad_field")]
        for kw, code in cases:
            with pytest.raises(hearth.HearthError) as ei:
                c.embed(**kw)
            assert ei.value.code == code, (kw, ei.value)
        assert len(c.embed("still serving").vectors) == 1
    # A generative model (no pooling_type) embeds only with a pooling named.
    with hearth.Client(daemon) as g:
        with pytest.raises(hearth.HearthError) as ei:
            g.embed("hello")
        assert ei.value.code == "bad_field" and "pooling_type is unspecified" in str(ei.value)
        v = g.embed("hello", pooling="mean").vectors[0]
        assert abs(sum(x * x for x in v) - 1) < 1e-5
