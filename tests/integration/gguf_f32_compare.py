"""Compares the F32 tensors of two GGUF files (imatrix files: NAME.in_sum2, NAME.counts): the
same names and shapes, and every value within TOL of its tensor's largest magnitude in the
second file. Prints the worst relative difference; exits 1 on any mismatch, naming it.
Usage: gguf_f32_compare.py A.gguf B.gguf TOL"""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read(path):
    b = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def text():
        nonlocal pos
        n = take("Q")
        pos += n
        return b[pos - n:pos].decode()

    def value(t):
        nonlocal pos
        if t == 8:
            return text()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        pos += SIZES[t]
        return None

    if b[:4] != b"GGUF":
        sys.exit("%s: not a GGUF file" % path)
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        key, t = text(), take("I")
        v = value(t)
        if key == "general.alignment":
            align = struct.unpack_from("<I", b, pos - 4)[0]
    infos = []
    for _ in range(n_tensors):
        name, nd = text(), take("I")
        ne = [take("Q") for _ in range(nd)]
        typ, off = take("I"), take("Q")
        infos.append((name, ne, typ, off))
    data = (pos + align - 1) // align * align
    out = {}
    for name, ne, typ, off in infos:
        if typ != 0:
            sys.exit("%s: %s is not F32" % (path, name))
        n = 1
        for d in ne:
            n *= d
        out[name] = (ne, struct.unpack_from("<%df" % n, b, data + off))
    return out


def main():
    a, b, tol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
    if sorted(a) != sorted(b):
        sys.exit("tensors differ: %s" % sorted(set(a) ^ set(b)))
    worst = 0.0
    for name in sorted(b):
        (na, va), (nb, vb) = a[name], b[name]
        if na != nb:
            sys.exit("%s: shape %s against %s" % (name, na, nb))
        top = max(abs(v) for v in vb) or 1.0
        for k, (x, y) in enumerate(zip(va, vb)):
            d = abs(x - y) / top
            worst = max(worst, d)
            if d > tol:
                sys.exit("%s[%d]: %g against %g" % (name, k, x, y))
    print("%d tensors, worst difference %.5f of a tensor's largest value" % (len(b), worst))


main()
