"""The blocking client: one connection to hearthd, requests answered in order of their
final frames, token streams read from the shared-memory ring (or `token` frames when the
daemon gives no ring). Same semantics and errors as libhearth."""

import json
import os
import select

from ._wire import (PROTO_MAJOR, PROTO_MINOR, Core, HearthError, embed_batches, embeddings_of, raise_if_error, raw_bytes,
                    text_of)

SOCKET_ENV = "HEARTH_SOCKET"
SOCKET_DEFAULT = "/run/hearth/hearth.sock"

# Python keyword -> wire field of generate/chat (doc/protocol.md "generate").
_GEN_FIELDS = {
    "max_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
    "min_p": "min_p", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "seed": "seed", "stop": "stop", "stop_tokens": "stop_tokens", "logprobs": "logprobs",
    "top_logprobs": "top_logprobs", "ignore_eos": "ignore_eos",
    "grammar": "grammar", "json_schema": "json_schema", "json_object": "json_object",
    "jump_forward": "jump_forward", "speculate": "speculate", "draft": "draft",
}


def socket_path_default():
    return os.environ.get(SOCKET_ENV) or SOCKET_DEFAULT


def gen_fields(params):
    out = {}
    for k, v in params.items():
        if k not in _GEN_FIELDS:
            raise TypeError(f"unknown generation parameter {k!r}")
        if v is not None:
            out[_GEN_FIELDS[k]] = v
    return out


def stats_of(frame):
    """A stats_reply frame as a dict, the same for both clients."""
    s = {k: v for k, v in frame.items() if k not in ("t", "id")}
    # Optional fields (no version bump): absent from an older daemon, then 0 and "".
    s.setdefault("prefix_lookup_tokens", 0)
    s.setdefault("prefix_hit_tokens", 0)
    s.setdefault("draft_tokens", 0)      # left out while 0, and by a daemon before 1.3
    s.setdefault("draft_accepted", 0)
    s.setdefault("draft_model_tokens", 0)  # left out while 0, and by a daemon before 1.4
    s.setdefault("draft_model_accepted", 0)
    s.setdefault("draft_kv_used", 0)     # left out without a draft model
    s.setdefault("draft_kv_total", 0)
    s["phase"] = text_of(s.get("phase", ""))
    return s


def _call_to_wire(call):
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    out = {"name": fn["name"], "arguments": args}
    if call.get("id"):
        out["id"] = call["id"]
    return out


def chat_fields(messages, tools=None, tool_choice=None, add_generation_prompt=True,
                variables=None, template=None):
    """OpenAI-shaped messages and tools -> the `chat` request's fields."""
    wire = []
    for m in messages:
        w = {"role": m["role"]}
        for k in ("content", "name", "tool_call_id", "reasoning_content"):
            if m.get(k) is not None:
                if not isinstance(m[k], str):
                    raise TypeError(f"message field {k!r} must be a string")
                w[k] = m[k]
        if m.get("tool_calls"):
            w["tool_calls"] = [_call_to_wire(c) for c in m["tool_calls"]]
        wire.append(w)
    out = {"messages": wire, "add_generation_prompt": bool(add_generation_prompt)}
    if tools:
        out["tools"] = json.dumps(tools, ensure_ascii=False)
    if tool_choice is not None:
        if isinstance(tool_choice, dict):
            tool_choice = tool_choice["function"]["name"]
        out["tool_choice"] = tool_choice
    if variables:
        out["vars"] = json.dumps(variables, ensure_ascii=False)
    if template:
        out["template"] = template
    return out


def message_of(done):
    """The assistant message of a chat's `done`, in OpenAI's shape."""
    m = done.get("message") or {}
    calls = [{"id": text_of(c.get("id", "")), "type": "function",
              "function": {"name": text_of(c.get("name", "")), "arguments": text_of(c.get("arguments", "{}"))}}
             for c in m.get("tool_calls", [])]
    out = {"role": "assistant", "content": text_of(m.get("content", ""))}
    if m.get("reasoning_content"):
        out["reasoning_content"] = text_of(m["reasoning_content"])
    if calls:
        out["tool_calls"] = calls
    return out


class ChatDelta:
    """A streamed piece of a chat reply: kind "content" or "reasoning" with text, or
    "tool_call" with call = {"id", "type", "function": {"name", "arguments"}}."""

    __slots__ = ("kind", "text", "call", "index")

    def __init__(self, f):
        self.kind = text_of(f.get("kind", ""))
        self.text = text_of(f.get("text", ""))
        self.index = f.get("index", 0)
        c = f.get("call")
        self.call = None
        if c:
            self.call = {"id": text_of(c.get("id", "")), "type": "function",
                         "function": {"name": text_of(c.get("name", "")),
                                      "arguments": text_of(c.get("arguments", "{}"))}}

    def __repr__(self):
        return f"ChatDelta({self.kind}, {self.text or self.call!r})"


class _Stream:
    """What a generate or chat stream and its end hold, for the blocking and asyncio forms."""

    def __init__(self, client, rid, chat):
        self._c = client
        self.id = rid
        self.chat = chat
        self.done = None
        self.message = None
        self.tokens = []

    def _event(self, kind, val):
        """One event: (True, item to hand out or None) or (False, None) at the end."""
        if kind == "token":
            self.tokens.append(val)
            return True, val
        if kind == "delta":
            return True, ChatDelta(val)
        if kind == "final":
            self._c._core.pending.pop(self.id, None)
            raise_if_error(val)
            self.done = {k: text_of(v) for k, v in val.items() if k not in ("t", "id", "message")}
            if self.chat:
                self.message = message_of(val)
            return False, None
        return True, None

    def text(self):
        return b"".join(t.text for t in self.tokens).decode("utf-8", "replace")


class Generation(_Stream):
    """A running generate or chat: iterate for its Tokens (and ChatDeltas for a chat),
    then read .done (the final frame's fields) and, for a chat, .message."""

    def __iter__(self):
        while True:
            more, item = self._event(*self._c._next_event(self.id))
            if not more:
                return
            if item is not None:
                yield item

    def wait(self):
        """Drains the stream; returns self."""
        for _ in self:
            pass
        return self

    def cancel(self):
        self._c.cancel(self.id)


class Embeddings:
    """What embed() returns: vectors (lists of floats), n_tokens per input, the pooling used."""

    def __init__(self):
        self.vectors, self.n_tokens, self.pooling = [], [], ""

    def add(self, vectors, n_tokens, pooling):
        self.vectors += vectors
        self.n_tokens += n_tokens
        self.pooling = pooling

    @property
    def total_tokens(self):
        return sum(self.n_tokens)


class Client:
    """hearth.Client(path=None, name="python", ring=True, on_loading=None, timeout=None)"""

    def __init__(self, path=None, name="python", ring=True, on_loading=None, timeout=None):
        self.path = path or socket_path_default()
        self.timeout = timeout
        self._core = Core(self.path)
        try:
            rid = self._core.new_id()
            self._core.send({"t": "hello", "id": rid, "proto": PROTO_MAJOR, "proto_minor": PROTO_MINOR,
                             "name": name, "ring": bool(ring)})
            while True:
                kind, f = self._next_event(rid)
                if kind == "loading" and on_loading:
                    on_loading(text_of(f.get("phase", "")), f.get("done", 0), f.get("total", 0))
                elif kind == "final":
                    break
            self._core.pending.pop(rid, None)
            raise_if_error(f)
            self.welcome = {k: v for k, v in f.items() if k not in ("t", "id")}
            self.model = {k: text_of(v) for k, v in (f.get("model") or {}).items()}
            self.proto_minor = f.get("proto_minor", 0)
        except BaseException:
            self._core.close()
            raise

    # -- plumbing --

    def _wait(self):
        fds = [self._core.sock]
        if self._core.ring:
            fds.append(self._core.ring.efd_client)
        r, _, _ = select.select(fds, [], [], self.timeout)
        if not r:
            raise HearthError("timeout", f"nothing from the daemon in {self.timeout} s")
        if self._core.ring:
            self._core.read_ring()
        if self._core.sock in r:
            self._core.read_socket()

    def _next_event(self, rid):
        q = self._core.pending.get(rid)
        while not q:
            if self._core.broken:
                raise self._core.broken
            self._wait()
            q = self._core.pending.get(rid)
        return q.pop(0)

    def _request(self, t, **fields):
        rid = self._core.new_id()
        self._core.send(dict(t=t, id=rid, **fields))
        while True:
            kind, f = self._next_event(rid)
            if kind == "final":
                self._core.pending.pop(rid, None)
                return raise_if_error(f)

    # -- requests --

    def generate(self, prompt=None, tokens=None, socket_tokens=False, **params):
        """Starts a generation of a text `prompt` or token ids `tokens`; iterate the result."""
        if (prompt is None) == (tokens is None):
            raise TypeError("give exactly one of prompt and tokens")
        msg = {"t": "generate", **gen_fields(params)}
        if prompt is not None:
            msg["prompt"] = prompt
        else:
            msg["tokens"] = list(tokens)
        if socket_tokens or not self._core.ring:
            msg["socket"] = True
        rid = self._core.new_id()
        msg["id"] = rid
        self._core.send(msg)
        return Generation(self, rid, chat=False)

    def chat(self, messages, tools=None, tool_choice=None, add_generation_prompt=True, variables=None,
             template=None, socket_tokens=False, **params):
        """Starts a chat turn with the model's own template; iterate for Tokens and ChatDeltas,
        then read .message (content, reasoning_content, tool_calls)."""
        msg = {"t": "chat", **chat_fields(messages, tools, tool_choice, add_generation_prompt, variables,
                                          template), **gen_fields(params)}
        if socket_tokens or not self._core.ring:
            msg["socket"] = True
        rid = self._core.new_id()
        msg["id"] = rid
        self._core.send(msg)
        return Generation(self, rid, chat=True)

    def complete(self, prompt, **params):
        """generate, drained: (text, done)."""
        g = self.generate(prompt, **params).wait()
        return g.text(), g.done

    def cancel(self, target):
        self._request("cancel", target=target)

    def tokenize(self, text, add_bos=True, special=False):
        return list(self._request("tokenize", text=text, add_bos=add_bos, special=special).get("tokens", []))

    def detokenize(self, tokens):
        return raw_bytes(self._request("detokenize", tokens=list(tokens)).get("text"))

    def embed(self, inputs, pooling=None):
        """Embeddings (protocol 1.4) of a string, strings, token ids or lists of token ids:
        Embeddings with .vectors (one unit-length list of floats per input, in order),
        .n_tokens and .pooling. pooling: "mean", "cls" or "last"; None: the model's."""
        if self.proto_minor < 4:
            raise HearthError("unknown_type", f"hearthd speaks protocol 1.{self.proto_minor}; embed needs 1.4")
        out = Embeddings()
        for kind, batch in embed_batches(inputs, int(self.model.get("n_embd") or 0)):
            fields = {kind: batch}
            if pooling is not None:
                fields["pooling"] = pooling
            out.add(*embeddings_of(self._request("embed", **fields)))
        return out

    def stats(self):
        return stats_of(self._request("stats"))

    def ledger(self):
        f = self._request("ledger")
        return {"entries": [(text_of(e.get("name", "")), e.get("bytes", 0)) for e in f.get("entries", [])],
                "total": f.get("total", 0), "peak": f.get("peak", 0)}

    def ping(self):
        self._request("ping")

    def close(self):
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
