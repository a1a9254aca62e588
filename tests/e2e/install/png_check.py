#!/usr/bin/env python3
"""Checks a Chromium screenshot of a `railyard report` page is not blank and its charts drew their lines.

    png_check.py SHOT.png MIN_PIXELS MIN_WIDTH COLOR...

Decodes the PNG itself (zlib + the five PNG filters; no PIL on the build machine) and checks: more than 20 distinct
colours, at least 3% of the pixels not white, and for each COLOR (#rrggbb of one chart's line, used nowhere else on the
page but in its legend swatch) at least MIN_PIXELS pixels of it (within a small tolerance for anti-aliasing) spanning
at least MIN_WIDTH pixels horizontally: a drawn line, not a legend swatch.
Prints what it measured; exit 0 pass, 1 fail.
"""
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(path + ": not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError("unsupported PNG: depth %d colour type %d interlace %d" % (depth, ctype, interlace))
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows


def main():
    path, min_pixels, min_width, wanted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    w, h, bpp, rows = decode(path)
    counts = {}
    for line in rows:
        for x in range(0, w):
            px = (line[x * bpp], line[x * bpp + 1], line[x * bpp + 2])
            c = counts.get(px)
            if c is None:
                counts[px] = [1, x, x]
            else:
                c[0] += 1
                c[1] = min(c[1], x)
                c[2] = max(c[2], x)
    nonwhite = w * h - counts.get((255, 255, 255), [0])[0]
    frac = nonwhite / float(w * h)
    print("screenshot %dx%d: %d distinct colours, %.1f%% not white" % (w, h, len(counts), 100 * frac))
    ok = True
    for color in wanted:
        want = tuple(int(color.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))
        hits, lo, hi = 0, w, -1
        for px, (n, x0, x1) in counts.items():
            if abs(px[0] - want[0]) + abs(px[1] - want[1]) + abs(px[2] - want[2]) <= 24:
                hits, lo, hi = hits + n, min(lo, x0), max(hi, x1)
        span = hi - lo + 1 if hits else 0
        print("  %s: %d pixels spanning %d px" % (color, hits, span))
        if hits < min_pixels or span < min_width:
            print("FAIL: the chart line %s is not drawn: %d pixels (want >= %d) over %d px (want >= %d)" %
                  (color, hits, min_pixels, span, min_width))
            ok = False
    if len(counts) <= 20:
        print("FAIL: %d distinct colours: the page looks blank" % len(counts))
        ok = False
    if frac < 0.03:
        print("FAIL: only %.1f%% of the pixels are not white" % (100 * frac))
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
