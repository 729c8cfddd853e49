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
import struct
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


def checksum(data):
    """The RFC 1071 checksum of `data`."""
    if len(data) % 2:
        data += b"\0"
    acc = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while acc >> 16:
        acc = (acc & 0xFFFF) + (acc >> 16)
    return ~acc & 0xFFFF


def tso_buffer(payload_len=8900):
    """A guest's IPv4 TCP GSO buffer (virtio_net_hdr + frame) from port opte0
    (a8:40:25:00:00:01, 172.30.0.5) through its gateway to 172.30.0.7 on another
    sled, with `payload_len` bytes: two segments at the 9000-byte underlay, so the
    super-frame and segmentation paths are reached."""
    payload = bytes(i * 7 & 0xFF for i in range(payload_len))
    src, dst = bytes([172, 30, 0, 5]), bytes([172, 30, 0, 7])
    tcp_len = 20 + len(payload)
    seed = ~checksum(src + dst + struct.pack("!HH", 6, tcp_len)) & 0xFFFF
    tcp = struct.pack("!HHIIBBHHH", 40000, 80, 1000, 0, 5 << 4, 0x02, 65535, seed, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + tcp_len, 1, 0x4000, 64, 6, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    eth = bytes.fromhex("a84025000002" "a84025000001" "0800")
    vnet = struct.pack("<BBHHHH", 1, 1, 54, 1448, 34, 16)
    return vnet + eth + ip + tcp + payload


def kept(target):
    """The checked-in seeds and regression inputs of a target, if it has any."""
    for d in (HERE / "seeds" / target, HERE / "regressions" / target):
        if d.is_dir():
            for f in sorted(d.iterdir()):
                yield f.read_bytes()


def seeds(target):
    yield from kept(target)
    if target == "process":
        # Both sleds (0x84: the top bit, guest port 0): the one that segments and
        # the one that sends super-frames.
        yield bytes([0]) + tso_buffer()
        yield bytes([0x84]) + tso_buffer()
    for kind, frame in frames():
        inner = kind == "inner"
        if target == "parse_inner" and inner:
            yield frame
        elif target == "parse_underlay" and not inner:
            yield frame
        elif target == "process":
            # First byte selects the path (modulo 3: 0/1 a guest port, modulo 2
            # which, with a 10-byte virtio_net_hdr in front; 2: underlay) and, with
            # its top bit, the sled that sends super-frames (0x84: guest port 0), as
            # fuzz_targets/process.rs reads it.
            if inner:
                yield bytes([0]) + bytes(10) + frame
                yield bytes([0x84]) + bytes(10) + frame
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
