"""The asyncio client: the same connection core as the blocking client, driven by the event
loop's readers on the socket and the ring's doorbell, so many generations of one connection
stream concurrently in one task each."""

import asyncio

from ._wire import (PROTO_MAJOR, PROTO_MINOR, Core, HearthError, embed_batches, embeddings_of, raise_if_error, raw_bytes,
                    text_of)
from .client import Embeddings, _Stream, chat_fields, gen_fields, socket_path_default, stats_of


class AsyncGeneration(_Stream):
    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.done is not None:
            raise StopAsyncIteration
        while True:
            more, item = self._event(*(await self._c._next_event(self.id)))
            if not more:
                raise StopAsyncIteration
            if item is not None:
                return item

    async def wait(self):
        async for _ in self:
            pass
        return self

    async def cancel(self):
        await self._c.cancel(self.id)


class AsyncClient:
    """await hearth.AsyncClient.connect(path=None, name="python", ring=True)"""

    def __init__(self):
        self._core = None
        self._changed = None
        self.welcome = self.model = None

    @classmethod
    async def connect(cls, path=None, name="python", ring=True):
        self = cls()
        self._core = Core(path or socket_path_default())
        self._core.sock.setblocking(False)
        self._changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(self._core.sock, self._on_socket)
        try:
            rid = self._core.new_id()
            self._core.send({"t": "hello", "id": rid, "proto": PROTO_MAJOR, "proto_minor": PROTO_MINOR,
                             "name": name, "ring": bool(ring)})
            while True:
                kind, f = await self._next_event(rid)
                if kind == "final":
                    break
            self._core.pending.pop(rid, None)
            raise_if_error(f)
        except BaseException:
            self._detach()
            self._core.close()
            raise
        if self._core.ring:
            loop.add_reader(self._core.ring.efd_client, self._on_ring)
        self.welcome = {k: v for k, v in f.items() if k not in ("t", "id")}
        self.model = {k: text_of(v) for k, v in (f.get("model") or {}).items()}
        return self

    def _detach(self):
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._core.sock)
        if self._core.ring:
            loop.remove_reader(self._core.ring.efd_client)

    def _on_socket(self):
        try:
            self._core.read_socket()
        except HearthError as e:
            self._core.broken = e
        except (BlockingIOError, InterruptedError):
            return
        if self._core.broken:
            asyncio.get_running_loop().remove_reader(self._core.sock)
        self._changed.set()

    def _on_ring(self):
        try:
            self._core.read_ring()
        except HearthError as e:
            self._core.broken = e
        self._changed.set()

    async def _next_event(self, rid):
        while True:
            q = self._core.pending.get(rid)
            if q:
                return q.pop(0)
            if self._core.broken:
                raise self._core.broken
            self._changed.clear()
            await self._changed.wait()

    async def _request(self, t, **fields):
        rid = self._core.new_id()
        self._core.send(dict(t=t, id=rid, **fields))
        while True:
            kind, f = await self._next_event(rid)
            if kind == "final":
                self._core.pending.pop(rid, None)
                return raise_if_error(f)

    def generate(self, prompt=None, tokens=None, **params):
        if (prompt is None) == (tokens is None):
            raise TypeError("give exactly one of prompt and tokens")
        rid = self._core.new_id()
        msg = {"t": "generate", "id": rid, **gen_fields(params)}
        if prompt is not None:
            msg["prompt"] = prompt
        else:
            msg["tokens"] = list(tokens)
        if not self._core.ring:
            msg["socket"] = True
        self._core.send(msg)
        return AsyncGeneration(self, rid, chat=False)

    def chat(self, messages, tools=None, tool_choice=None, add_generation_prompt=True, variables=None,
             template=None, **params):
        rid = self._core.new_id()
        msg = {"t": "chat", "id": rid, **chat_fields(messages, tools, tool_choice, add_generation_prompt,
                                                     variables, template), **gen_fields(params)}
        if not self._core.ring:
            msg["socket"] = True
        self._core.send(msg)
        return AsyncGeneration(self, rid, chat=True)

    async def cancel(self, target):
        await self._request("cancel", target=target)

    async def tokenize(self, text, add_bos=True, special=False):
        f = await self._request("tokenize", text=text, add_bos=add_bos, special=special)
        return list(f.get("tokens", []))

    async def detokenize(self, tokens):
        return raw_bytes((await self._request("detokenize", tokens=list(tokens))).get("text"))

    async def embed(self, inputs, pooling=None):
        """As Client.embed."""
        out = Embeddings()
        for kind, batch in embed_batches(inputs, int(self.model.get("n_embd") or 0)):
            fields = {kind: batch}
            if pooling is not None:
                fields["pooling"] = pooling
            out.add(*embeddings_of(await self._request("embed", **fields)))
        return out

    async def stats(self):
        return stats_of(await self._request("stats"))

    async def ping(self):
        await self._request("ping")

    async def close(self):
        self._detach()
        self._core.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
