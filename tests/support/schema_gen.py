#!/usr/bin/python3
"""Random JSON Schemas for the converter's validity test: nesting, enums, const, arrays
(items, prefixItems, min/maxItems), $defs with recursive $ref, formats, patterns, integer
bounds, string lengths, anyOf / disjoint oneOf / object allOf, additionalProperties.
usage: schema_gen.py OUTDIR COUNT SEED"""
import json
import random
import sys

PATTERNS = [
    r"^[A-Z]{2}-\d{3,5}$",
    r"^(foo|bar)+baz?$",
    r"^[a-z0-9._%+-]+@[a-z]+\.(com|org)$",
    r"^\w{1,8}(\s\w{1,8}){0,3}$",
    r"^[^\"\\]{0,10}$",
    r"^#[0-9a-fA-F]{6}$",
    r"^(?:\+1 )?\(\d{3}\) \d{3}-\d{4}$",
    r"^[\u00e0-\u00ff]+ \.\*$",
    r"^a(b|c)*d$",
    r"^.{2,6}$",
]
FORMATS = ["date", "time", "date-time", "uuid", "email"]
WORDS = ["id", "name", "value", "items", "kind", "x", "y", "z", "count", "tags", "meta",
         "created_at", "note", "é", "sp ace", "q\"uote", "back\\slash", "flag", "ratio", "ref"]


class Gen:
    def __init__(self, rnd):
        self.r = rnd
        self.defs = {}

    def string(self):
        r = self.r
        s = {"type": "string"}
        k = r.random()
        if k < 0.2:
            s["format"] = r.choice(FORMATS)
        elif k < 0.35:
            s["pattern"] = r.choice(PATTERNS)
        elif k < 0.6:
            lo = r.randint(0, 5)
            if r.random() < 0.5:
                s["minLength"] = lo
            if r.random() < 0.7:
                s["maxLength"] = lo + r.randint(0, 8)
        return s

    def integer(self):
        r = self.r
        s = {"type": "integer"}
        lo = r.choice([-1000, -37, -5, 0, 1, 9, 10, 99, 100, 12345])
        hi = lo + r.choice([0, 1, 7, 90, 1000, 99999])
        k = r.random()
        if k < 0.25:
            s["minimum"] = lo
        elif k < 0.45:
            s["maximum"] = hi
        elif k < 0.7:
            s["minimum"], s["maximum"] = lo, hi
        elif k < 0.85:
            s["exclusiveMinimum"], s["exclusiveMaximum"] = lo - 1, hi + 1
        return s

    def scalar(self):
        r = self.r
        k = r.random()
        if k < 0.3:
            return self.string()
        if k < 0.5:
            return self.integer()
        if k < 0.6:
            return {"type": "number"}
        if k < 0.7:
            return {"type": "boolean"}
        if k < 0.75:
            return {"type": "null"}
        if k < 0.85:
            vals = r.sample(["a", "b c", "é", 1, 2.5, -3, True, None, {"k": [1]}, [], "x\"y"], r.randint(1, 4))
            return {"enum": vals}
        if k < 0.9:
            return {"const": r.choice(["fixed", 42, False, None, {"a": "b"}])}
        return {"type": r.sample(["string", "integer", "boolean", "null"], 2)}

    def schema(self, depth):
        r = self.r
        if depth <= 0 or r.random() < 0.35:
            return self.scalar()
        k = r.random()
        if k < 0.35:
            return self.obj(depth)
        if k < 0.55:
            return self.arr(depth)
        if k < 0.65:
            return {"anyOf": [self.schema(depth - 1) for _ in range(r.randint(1, 3))]}
        if k < 0.72:
            return {"oneOf": [{"type": "string", "maxLength": 5}, {"type": "integer"}, {"type": "array", "items": self.scalar(), "maxItems": 2}][: r.randint(2, 3)]}
        if k < 0.8:
            return {"allOf": [self.obj(depth - 1, props_only=True, words=WORDS[:10]),
                              self.obj(depth - 1, props_only=True, words=WORDS[10:])]}
        if k < 0.9:
            name = "d%d" % len(self.defs)
            self.defs[name] = None
            self.defs[name] = self.schema(depth - 1)
            return {"$ref": "#/$defs/" + name}
        return self.tree()

    def tree(self):
        # a recursive definition: a node with optional children of the same kind
        name = "node%d" % len(self.defs)
        self.defs[name] = {
            "type": "object",
            "properties": {
                "label": self.string(),
                "children": {"type": "array", "items": {"$ref": "#/$defs/" + name}, "maxItems": 2},
            },
            "required": ["label"],
        }
        return {"$ref": "#/$defs/" + name}

    def obj(self, depth, props_only=False, words=WORDS):
        r = self.r
        names = r.sample(words, r.randint(0 if not props_only else 1, 5))
        props = {n: self.schema(depth - 1) for n in names}
        s = {"type": "object", "properties": props}
        if names:
            s["required"] = r.sample(names, r.randint(0, len(names)))
        if not props_only:
            k = r.random()
            plain = all(all(0x20 <= ord(c) < 0x7f and c not in "\"\\" for c in n) for n in names)
            if k < 0.2:
                s["additionalProperties"] = False
            elif k < 0.3 and plain:
                s["additionalProperties"] = self.scalar()
            elif k < 0.35 and plain:
                s["additionalProperties"] = True
        return s

    def arr(self, depth):
        r = self.r
        s = {"type": "array"}
        if r.random() < 0.25:
            s["prefixItems"] = [self.schema(depth - 1) for _ in range(r.randint(1, 3))]
            if r.random() < 0.5:
                s["items"] = False
            elif r.random() < 0.5:
                s["items"] = self.scalar()
        else:
            s["items"] = self.schema(depth - 1)
        if r.random() < 0.5:
            lo = r.randint(0, 3)
            s["minItems"] = lo
            if r.random() < 0.6:
                s["maxItems"] = lo + r.randint(0, 4)
        if s.get("items") is False and "minItems" in s:
            s["minItems"] = min(s["minItems"], len(s["prefixItems"]))
        return s


def main():
    out, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rnd = random.Random(seed)
    for i in range(count):
        g = Gen(rnd)
        s = g.schema(rnd.randint(1, 4))
        if g.defs:
            s = {"$defs": g.defs, **s} if "$ref" not in s else {"$defs": g.defs, "$ref": s["$ref"]}
        with open("%s/random-%03d.json" % (out, i), "w") as f:
            json.dump(s, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
