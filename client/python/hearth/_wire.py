"""Frames and the shared-memory ring of the hearth protocol (doc/protocol.md), as a
connection core without any waiting policy: the sync and asyncio clients both drive it.
Every byte from the daemon is checked before use, as libhearth checks it."""

import ctypes
import mmap
import os
import socket
import struct

import msgpack

PROTO_MAJOR = 1
PROTO_MINOR = 4
FRAME_MAX = 1 << 20
FRAME_SKIP_LIMIT = 64 << 20

RING_MAGIC = 0x474E5248
RING_VERSION = 1
RING_HEADER_SIZE = 4096
RING_OFF_D2C_HEAD = 128
RING_OFF_D2C_TAIL = 256
REC_PAD, REC_TOKEN, REC_LOGITS = 0, 1, 2
TOKEN_TEXT_MAX = 1024
TOP_MAX = 64

FINAL_TYPES = {"welcome", "done", "tokens", "text", "stats_reply", "ledger_reply", "pong", "error"}


class HearthError(Exception):
    """An error frame of the daemon, or a broken connection/ring (code "closed"/"ring")."""

    def __init__(self, code, message, fatal=False):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fatal = fatal


class Token:
    """One sampled token: id, its raw bytes (may split a UTF-8 sequence), logprob and top
    alternatives [(id, logprob)] when asked for."""

    __slots__ = ("id", "text", "logprob", "top", "t_sampled_ns")

    def __init__(self, id, text, logprob=None, top=(), t_sampled_ns=0):
        self.id = id
        self.text = text
        self.logprob = logprob
        self.top = list(top)
        self.t_sampled_ns = t_sampled_ns

    def __repr__(self):
        return f"Token({self.id}, {self.text!r})"


def encode_frame(msg):
    payload = msgpack.packb(msg, use_bin_type=False)
    if len(payload) > FRAME_MAX:
        raise HearthError("too_large", f"frame of {len(payload)} bytes exceeds {FRAME_MAX}")
    return struct.pack(">I", len(payload)) + payload


def _decode_payload(payload):
    try:
        # Daemon text is raw bytes in a str (a token may split a UTF-8 sequence):
        # surrogateescape keeps every byte, and raw_bytes() gives them back exactly.
        m = msgpack.unpackb(payload, raw=False, unicode_errors="surrogateescape", strict_map_key=False)
    except Exception as e:  # msgpack raises several types for malformed input
        raise HearthError("bad_frame", f"undecodable frame from the daemon: {e}", True)
    if not isinstance(m, dict):
        raise HearthError("bad_frame", "a daemon frame is not a map", True)
    if not isinstance(m.get("t"), str):
        raise HearthError("bad_frame", "a daemon frame has no type", True)
    return m


def raw_bytes(v):
    """The exact bytes of a daemon text field."""
    return v.encode("utf-8", "surrogateescape") if isinstance(v, str) else bytes(v or b"")


def text_of(v):
    """A daemon text field for display: bytes that are not UTF-8 become U+FFFD."""
    if isinstance(v, str):
        v = v.encode("utf-8", "surrogateescape")
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


class Ring:
    """The client side of one shared-memory ring: consumer of daemon->client records."""

    def __init__(self, memfd, efd_client, efd_daemon):
        size = os.fstat(memfd).st_size
        if size < RING_HEADER_SIZE:
            raise HearthError("ring", f"ring memfd of {size} bytes is smaller than its header", True)
        self.mm = mmap.mmap(memfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        magic, version, header, _flags, d2c_off, d2c_cap = struct.unpack_from("<IIIIQQ", self.mm, 0)
        if magic != RING_MAGIC or version != RING_VERSION or header != RING_HEADER_SIZE:
            raise HearthError("ring", "ring control page has a bad magic, version or header size", True)
        if d2c_cap < 4096 or d2c_cap & (d2c_cap - 1) or d2c_off != RING_HEADER_SIZE or d2c_off + d2c_cap > size:
            raise HearthError("ring", "ring geometry does not fit its memfd", True)
        self.off, self.cap = d2c_off, d2c_cap
        self._head = ctypes.c_uint64.from_buffer(self.mm, RING_OFF_D2C_HEAD)
        self._tail = ctypes.c_uint64.from_buffer(self.mm, RING_OFF_D2C_TAIL)
        self.pos = self._tail.value
        self.seen = self.pos
        self.memfd, self.efd_client, self.efd_daemon = memfd, efd_client, efd_daemon
        os.set_blocking(efd_client, False)

    def close(self):
        # The ctypes views export the map's buffer: drop them before closing it.
        self._head = self._tail = None
        try:
            self.mm.close()
        except BufferError:
            pass
        for fd in (self.memfd, self.efd_client, self.efd_daemon):
            os.close(fd)

    def clear_doorbell(self):
        try:
            os.eventfd_read(self.efd_client)
        except BlockingIOError:
            pass

    def pop_all(self):
        """Copies out every published record: [(type, payload bytes)]. Raises on a broken ring."""
        head = self._head.value
        if head < self.seen or head - self.pos > self.cap or head % 8:
            raise HearthError("ring", "the daemon's ring head is out of bounds", True)
        self.seen = head
        out = []
        while self.pos < head:
            at = self.pos & (self.cap - 1)
            ln, typ = struct.unpack_from("<II", self.mm, self.off + at)
            if ln > self.cap - at - 8 or 8 + ((ln + 7) & ~7) > head - self.pos:
                raise HearthError("ring", "a ring record overruns what was published", True)
            if typ == REC_PAD:
                if 8 + ln != self.cap - at:
                    raise HearthError("ring", "a padding record does not reach the end", True)
            else:
                out.append((typ, bytes(self.mm[self.off + at + 8:self.off + at + 8 + ln])))
            self.pos += 8 + ((ln + 7) & ~7)
        if out or head != self._tail.value:
            self._tail.value = self.pos
            os.eventfd_write(self.efd_daemon, 1)
        return out


def parse_token_record(p):
    """A TOKEN record's payload -> (request_id, Token); raises on any inconsistency."""
    if len(p) < 32:
        raise HearthError("ring", "short token record", True)
    rid, tok, flags, lp, tlen, ntop, t_ns = struct.unpack_from("<QIIfHHQ", p, 0)
    if flags & ~1 or tlen > TOKEN_TEXT_MAX or ntop > TOP_MAX:
        raise HearthError("ring", "token record with bad flags or counts", True)
    tpad = (tlen + 3) & ~3
    if len(p) != 32 + tpad + 8 * ntop:
        raise HearthError("ring", "token record length does not match its counts", True)
    text = p[32:32 + tlen]
    top = [struct.unpack_from("<If", p, 32 + tpad + 8 * i) for i in range(ntop)]
    return rid, Token(tok, text, lp if flags & 1 else None, top, t_ns)


class Core:
    """Socket framing, fd reception before welcome, and demultiplexing by request id.
    Events for a request land in pending[id] as ("token", Token), ("delta", dict),
    ("logits", bytes) or ("final", frame dict)."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise HearthError("closed", f"cannot connect to {path}: {e.strerror}") from None
        self.buf = bytearray()
        self.fds = []
        self.ring = None
        self.welcomed = False
        self.next_id = 1
        self.pending = {}      # id -> list of events
        self.broken = None     # HearthError once the connection is unusable

    def close(self):
        if self.ring:
            self.ring.close()
            self.ring = None
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.sock.close()

    def new_id(self):
        rid = self.next_id
        self.next_id += 1
        self.pending[rid] = []
        return rid

    def send(self, msg):
        if self.broken:
            raise self.broken
        self.sock.sendall(encode_frame(msg))

    def read_socket(self):
        """Reads what the socket has (it must be readable) and dispatches whole frames."""
        try:
            if self.welcomed:
                data = self.sock.recv(1 << 16)
                anc = []
            else:
                data, anc, _flags, _addr = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(3 * 4))
        except (ConnectionResetError, BrokenPipeError):
            data, anc = b"", []  # a daemon that died: the same as a closed socket
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                n = len(cdata) // 4
                self.fds.extend(struct.unpack(f"{n}i", cdata[:4 * n]))
        if not data:
            self.broken = HearthError("closed", "the daemon closed the connection", True)
            for ev in self.pending.values():
                ev.append(("final", {"t": "error", "code": "closed", "message": "the daemon closed the connection"}))
            return
        self.buf += data
        while len(self.buf) >= 4:
            (n,) = struct.unpack_from(">I", self.buf, 0)
            if n > FRAME_SKIP_LIMIT:
                raise HearthError("bad_frame", f"daemon frame of {n} bytes: framing lost", True)
            if len(self.buf) < 4 + n:
                break
            frame = _decode_payload(bytes(self.buf[4:4 + n]))
            del self.buf[:4 + n]
            self._dispatch(frame)

    def _dispatch(self, f):
        rid = f.get("id", 0)
        if f["t"] == "welcome" and f.get("ring"):
            if len(self.fds) != 3:
                raise HearthError("ring", f"welcome came with {len(self.fds)} descriptors, not 3", True)
            self.ring = Ring(*self.fds)
            self.fds = []
        if f["t"] == "welcome":
            self.welcomed = True
        if rid == 0:
            if f["t"] == "error":
                self.broken = HearthError(text_of(f.get("code", "internal")), text_of(f.get("message", "")),
                                          bool(f.get("fatal")))
            return
        ev = self.pending.get(rid)
        if ev is None:
            return  # a reply to a request the caller already abandoned
        if f["t"] == "token":
            ev.append(("token", Token(f.get("token"), raw_bytes(f.get("text")), f.get("logprob"),
                                      [tuple(x) for x in f.get("top", [])])))
        elif f["t"] == "delta":
            ev.append(("delta", f))
        elif f["t"] in FINAL_TYPES:
            # The daemon pushes a request's ring records before its final frame: take them
            # first, so nothing of the request is left behind in the ring.
            self.read_ring()
            ev.append(("final", f))
        else:
            ev.append((f["t"], f))

    def read_ring(self):
        if not self.ring:
            return
        self.ring.clear_doorbell()
        for typ, p in self.ring.pop_all():
            if typ == REC_TOKEN:
                rid, tok = parse_token_record(p)
                ev = self.pending.get(rid)
                if ev is not None:
                    ev.append(("token", tok))
            elif typ == REC_LOGITS:
                if len(p) < 16:
                    raise HearthError("ring", "short logits record", True)
                rid, _idx, nv = struct.unpack_from("<QII", p, 0)
                if len(p) != 16 + 4 * nv:
                    raise HearthError("ring", "logits record length does not match n_vocab", True)
                ev = self.pending.get(rid)
                if ev is not None:
                    ev.append(("logits", p[16:]))


def raise_if_error(f):
    if f["t"] == "error":
        raise HearthError(text_of(f.get("code", "internal")), text_of(f.get("message", "")),
                          bool(f.get("fatal")))
    return f
