#!/usr/bin/env python3
"""Writes a seed corpus for one fuzz target from the wire crate's known-answer
vectors (datapath/wire/testdata/vectors.txt, generated with scapy), so short runs
start from real frames instead of random bytes.

usage: seeds.py TARGET DIR
"""
import pathlib
import sys

VECTORS = pathlib.Path(__file__).resolve().parent.parent / "datapath/wire/testdata/vectors.txt"


def frames():
    """(kind, bytes) of every vector."""
    for line in VECTORS.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "frame" in fields:
            yield fields["kind"], bytes.fromhex(fields["frame"])


def seeds(target):
    for kind, frame in frames():
        inner = kind == "inner"
        if target == "parse_inner" and inner:
            yield frame
        elif target == "parse_underlay" and not inner:
            yield frame
        elif target == "process":
            # First byte selects the path (0/1: guest port 0/1 with a 10-byte
            # virtio_net_hdr in front, 2: underlay), as fuzz_targets/process.rs reads it.
            yield (bytes([0]) + bytes(10) + frame) if inner else (bytes([2]) + frame)


def main():
    target, out = sys.argv[1], pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for n, seed in enumerate(seeds(target), 1):
        (out / f"seed{n}").write_bytes(seed)
    if n == 0:
        sys.exit(f"seeds.py: no seeds for target {target!r}")


if __name__ == "__main__":
    main()
