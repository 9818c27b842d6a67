"""Summarise glibc malloc_info XML: per heap system/free, and free bytes by chunk-size class (all heaps)."""
# ruff: noqa: E501  (a scratch summary kept as it ran)

import sys
import xml.etree.ElementTree as ET

CLS = [(0, 1024), (1025, 4096), (4097, 16384), (16385, 65536), (65537, 1 << 62)]
for path in sys.argv[1:]:
    root = ET.parse(path).getroot()
    byc = [[0, 0] for _ in CLS]
    print(f"== {path}")
    tops = []
    for h in root.findall("heap"):
        sysc = int(h.find("system[@type='current']").get("size"))
        fr = sum(int(t.get("size")) for t in h.findall("total"))
        n = sum(int(t.get("count")) for t in h.findall("total"))
        for s in h.find("sizes"):
            lo, cnt, tot = int(s.get("from")), int(s.get("count")), int(s.get("total"))
            for i, (a, b) in enumerate(CLS):
                if a <= lo <= b:
                    byc[i][0] += cnt
                    byc[i][1] += tot
        hist = sum(int(x.get("total")) for x in h.find("sizes"))
        tops.append((fr - hist) if h.get("nr") != "0" else 0)
        if sysc > 1 << 20:
            print(
                f"  heap {h.get('nr'):>2s}: system {sysc / 2**20:7.2f} MB, free {fr / 2**20:6.2f} MB in {n} chunks"
                f" (top chunk ~{(fr - hist) / 2**20:.2f} MB, binned {hist / 2**20:.2f} MB)"
            )
    others = [h for h in root.findall("heap") if int(h.find("system[@type='current']").get("size")) <= 1 << 20]
    if others:
        print(
            f"  {len(others)} small heaps: system {sum(int(h.find(chr(115) + 'ystem[@type=' + chr(39) + 'current' + chr(39) + ']').get('size')) for h in others) / 2**20:.2f} MB"
        )
    print(f"  non-main heaps: top chunks ~{sum(tops) / 2**20:.2f} MB in all")
    for t in root.findall("total"):
        print(f"  total {t.get('type'):5s}: {int(t.get('size')) / 2**20:7.2f} MB in {t.get('count')} chunks")
    print("  free by chunk size (from the size histograms; the top chunk is not in them):")
    for (a, b), (c, t) in zip(CLS, byc, strict=False):
        print(f"    {a:>6d}..{b if b < 1 << 40 else 'inf':>6}: {c:6d} chunks {t / 2**20:7.2f} MB")
