#!/usr/bin/env python3
"""Writes a seed corpus for one fuzz target, so short runs start from real inputs
instead of random bytes: for the packet targets, frames from the wire crate's
known-answer vectors (datapath/wire/testdata/vectors.txt, generated with scapy); for
`api`, the checked-in request sequences (seeds/api: one per request type, replayed by
control/tests/api_corpus.rs) and every input kept from earlier campaigns
(regressions/api).

usage: seeds.py TARGET DIR
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
VECTORS = HERE.parent / "datapath/wire/testdata/vectors.txt"


def frames():
    """(kind, bytes) of every vector."""
    for line in VECTORS.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "frame" in fields:
            yield fields["kind"], bytes.fromhex(fields["frame"])


def kept(target):
    """The checked-in seeds and regression inputs of a target, if it has any."""
    for d in (HERE / "seeds" / target, HERE / "regressions" / target):
        if d.is_dir():
            for f in sorted(d.iterdir()):
                yield f.read_bytes()


def seeds(target):
    yield from kept(target)
    for kind, frame in frames():
        inner = kind == "inner"
        if target == "parse_inner" and inner:
            yield frame
        elif target == "parse_underlay" and not inner:
            yield frame
        elif target == "process":
            # First byte selects the path (0/1: guest port 0/1 with a 10-byte
            # virtio_net_hdr in front, 2: underlay) and, with its top bit, the sled
            # that sends super-frames, as fuzz_targets/process.rs reads it.
            if inner:
                yield bytes([0]) + bytes(10) + frame
                yield bytes([0x80]) + bytes(10) + frame
            else:
                yield bytes([2]) + frame


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
