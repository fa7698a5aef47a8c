#!/usr/bin/python3
"""Independent GBNF recognizer for the grammar engine's tests: its own parser of llama.cpp's
GBNF syntax and a memoised set-of-end-positions matcher over code points. Reads lines
"FILE<TAB>HEX[<TAB>VERDICT]" (from tests/support/grammar_sample) and checks that every
sample is in its grammar's language and that the engine's verdict on mutants agrees.
Prints TAP, one test per grammar file."""
import sys
import threading


class Grammar:
    def __init__(self, text):
        self.s = text
        self.i = 0
        self.rules = {}
        self.parse()

    def err(self, what):
        raise ValueError("%s at offset %d" % (what, self.i))

    def peek(self):
        return self.s[self.i] if self.i < len(self.s) else ""

    def space(self, nl):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (nl and c in "\r\n"):
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def name(self):
        st = self.i
        while self.i < len(self.s) and (self.s[self.i].isalnum() or self.s[self.i] in "-_"):
            self.i += 1
        if st == self.i:
            self.err("expected name")
        return self.s[st:self.i]

    def char(self):
        c = self.s[self.i]
        if c != "\\":
            self.i += 1
            return ord(c)
        e = self.s[self.i + 1]
        self.i += 2
        hexn = {"x": 2, "u": 4, "U": 8}.get(e)
        if hexn:
            v = int(self.s[self.i:self.i + hexn], 16)
            self.i += hexn
            return v
        return ord({"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}.get(e, e))

    def parse(self):
        self.space(True)
        while self.i < len(self.s):
            n = self.name()
            self.space(False)
            if self.s[self.i:self.i + 3] != "::=":
                self.err("expected ::=")
            self.i += 3
            self.space(True)
            self.rules[n] = self.alts(False)
            self.space(True)

    def alts(self, nested):
        out = [self.seq(nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            out.append(self.seq(nested))
        return ("alt", out)

    def seq(self, nested):
        items = []
        while True:
            c = self.peek()
            if c == '"':
                self.i += 1
                cps = []
                while self.s[self.i] != '"':
                    cps.append(self.char())
                self.i += 1
                el = ("lit", "".join(map(chr, cps)))
            elif c == "[":
                self.i += 1
                neg = self.peek() == "^"
                if neg:
                    self.i += 1
                ranges = []
                while self.s[self.i] != "]":
                    lo = self.char()
                    hi = lo
                    if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                        self.i += 1
                        hi = self.char()
                    ranges.append((lo, hi))
                self.i += 1
                el = ("cls", ranges, neg)
            elif c == ".":
                self.i += 1
                el = ("cls", [], True)
            elif c == "(":
                self.i += 1
                self.space(True)
                el = self.alts(True)
                if self.peek() != ")":
                    self.err("expected )")
                self.i += 1
            elif c and (c.isalnum() or c in "-_"):
                el = ("ref", self.name())
            else:
                break
            self.space(nested)
            while self.peek() in ("*", "+", "?", "{") and self.peek():
                op = self.peek()
                self.i += 1
                if op == "*":
                    el = ("rep", el, 0, None)
                elif op == "+":
                    el = ("rep", el, 1, None)
                elif op == "?":
                    el = ("rep", el, 0, 1)
                else:
                    j = self.s.index("}", self.i)
                    body = self.s[self.i:j].replace(" ", "")
                    self.i = j + 1
                    if "," in body:
                        a, b = body.split(",")
                        el = ("rep", el, int(a or 0), int(b) if b else None)
                    else:
                        el = ("rep", el, int(body), int(body))
                self.space(nested)
            items.append(el)
        return ("seq", items)


class Matcher:
    def __init__(self, g, text):
        self.g = g
        self.t = text
        self.memo = {}

    def ends(self, e, i):
        k = e[0]
        t = self.t
        if k == "lit":
            return {i + len(e[1])} if t.startswith(e[1], i) else set()
        if k == "cls":
            if i >= len(t):
                return set()
            c = ord(t[i])
            inside = any(lo <= c <= hi for lo, hi in e[1])
            return {i + 1} if inside != e[2] else set()
        if k == "seq":
            cur = {i}
            for el in e[1]:
                nxt = set()
                for p in cur:
                    nxt |= self.ends(el, p)
                cur = nxt
                if not cur:
                    break
            return cur
        if k == "alt":
            out = set()
            for a in e[1]:
                out |= self.ends(a, i)
            return out
        if k == "ref":
            key = (e[1], i)
            if key in self.memo:
                return self.memo[key]
            self.memo[key] = set()  # no left recursion: a re-entry at i matches nothing
            r = self.ends(self.g.rules[e[1]], i)
            self.memo[key] = r
            return r
        if k == "rep":
            _, el, lo, hi = e
            out = set()
            cur = {i}
            seen = set()
            n = 0
            while cur:
                if n >= lo:
                    out |= cur
                if hi is not None and n >= hi:
                    break
                nxt = set()
                for p in cur:
                    nxt |= self.ends(el, p)
                # positions already expanded at a count >= lo add nothing new
                if n >= lo:
                    nxt -= seen
                    seen |= cur
                cur = nxt
                n += 1
            return out
        raise ValueError(k)


def accepts(g, data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return len(text) in Matcher(g, text).ends(("ref", "root"), 0)


def main():
    grammars = {}
    results = {}
    order = []
    for line in sys.stdin:
        parts = line.rstrip("\n").split("\t")
        f = parts[0]
        if f not in results:
            results[f] = [0, 0, []]
            order.append(f)
        if parts[1].startswith("error:"):
            results[f][2].append(parts[1])
            continue
        if f not in grammars:
            grammars[f] = Grammar(open(f, encoding="utf-8").read())
        data = bytes.fromhex(parts[1])
        want = parts[2] == "1" if len(parts) > 2 else True
        got = accepts(grammars[f], data)
        results[f][0] += 1
        if got != want:
            results[f][2].append("%r: engine says %s, recognizer %s" % (data[:80], want, got))
        elif want:
            results[f][1] += 1
    print("1..%d" % len(order))
    for n, f in enumerate(order, 1):
        total, good, errs = results[f]
        ok = not errs and total > 0
        print("%s %d - %s: %d strings, %d accepted samples, engine and recognizer agree" %
              ("ok" if ok else "not ok", n, f, total, good))
        for e in errs[:5]:
            print("#   " + e)


if __name__ == "__main__":
    sys.setrecursionlimit(200000)
    threading.stack_size(512 * 1024 * 1024)
    th = threading.Thread(target=main)
    th.start()
    th.join()
