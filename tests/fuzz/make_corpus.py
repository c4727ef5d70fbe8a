#!/usr/bin/env python3
"""Writes the seed corpus of store_frame_fuzzer into corpus/ (run from anywhere; idempotent).

Each seed is a mode byte (see store_frame_fuzzer.cc) followed by frames a client could send,
hand-encoded from sdk/proto/store.proto so that no protobuf Python package is needed.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, n):
    return varint(num << 3) + varint(n)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint((num << 3) | 2) + varint(len(b)) + b


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


def hello(job="fuzz-job", nonce=b"n" * 32, version=1):
    return frame(f_bytes(1, f_varint(1, version) + f_bytes(2, job) + f_bytes(3, nonce)))


def proof(p=b"p" * 32):
    return frame(f_bytes(2, f_bytes(1, p)))


def request(rid, op_field, op, generation=None):
    body = f_varint(1, rid)
    if generation is not None:
        body += f_varint(2, generation)
    body += f_bytes(op_field, op)
    return frame(f_bytes(3, body))


SET, GET, ADD, CAS, DELETE, MULTI_GET, LIST_KEYS, WAIT, RAISE_FENCE, WAIT_ANY, WRITE_BATCH = range(10, 21)


def set_(rid, key, value, generation=None):
    return request(rid, SET, f_bytes(1, key) + f_bytes(2, value), generation)


def get(rid, key):
    return request(rid, GET, f_bytes(1, key))


def add(rid, key, delta):
    return request(rid, ADD, f_bytes(1, key) + f_varint(2, delta))


def cas(rid, key, expected, desired):
    op = f_bytes(1, key)
    if expected is not None:
        op += f_varint(2, 1) + f_bytes(3, expected)
    return request(rid, CAS, op + f_bytes(4, desired))


def batch(rid, writes, generation=None):
    # writes: ("set", key, value) | ("cas", key, expected, desired) | ("fence", generation)
    body = b""
    for w in writes:
        if w[0] == "set":
            one = f_bytes(1, f_bytes(1, w[1]) + f_bytes(2, w[2]))
        elif w[0] == "cas":
            op = f_bytes(1, w[1])
            if w[2] is not None:
                op += f_varint(2, 1) + f_bytes(3, w[2])
            one = f_bytes(2, op + f_bytes(4, w[3]))
        else:
            one = f_bytes(3, f_varint(1, w[1]))
        body += f_bytes(1, one)
    return request(rid, WRITE_BATCH, body, generation)


def wait(rid, keys, timeout_ms):
    return request(rid, WAIT, b"".join(f_bytes(1, k) for k in keys) + f_varint(2, timeout_ms))


AUTHENTICATED_BYTE_CHUNKS = b"\x01"  # 1-byte chunks
AUTHENTICATED_MID_CHUNKS = b"\x09"  # 29-byte chunks
AUTHENTICATED_BIG_CHUNKS = b"\xff"  # 890-byte chunks
FRESH = b"\x10"  # handshake first, 57-byte chunks

SEEDS = {
    "set_get": AUTHENTICATED_MID_CHUNKS
    + set_(1, "a/key", b"binary\0value\xff")
    + get(2, "a/key")
    + get(3, "no/such/key"),
    "add": AUTHENTICATED_BIG_CHUNKS
    + add(1, "n", 5)
    + add(2, "n", -2)
    + set_(3, "text", "hello")
    + add(4, "text", 1)
    + set_(5, "max", "9223372036854775807")
    + add(6, "max", 1),
    "compare_and_set": AUTHENTICATED_BIG_CHUNKS
    + cas(1, "leader", None, "one")
    + cas(2, "leader", "zero", "two")
    + cas(3, "leader", "one", "two"),
    "wait_then_set": AUTHENTICATED_BYTE_CHUNKS
    + wait(1, ["k", "k2"], 100)
    + set_(2, "k", "1")
    + request(3, DELETE, f_bytes(1, "k"))
    + set_(4, "k2", "2")
    + set_(5, "k", "again")
    + wait(6, ["absent"], 0),
    "fence": AUTHENTICATED_MID_CHUNKS
    + set_(1, "state", "gen1", generation=1)
    + request(2, RAISE_FENCE, f_varint(1, 5))
    + set_(3, "state", "zombie", generation=1)
    + request(4, DELETE, f_bytes(1, "state"), generation=1)
    + request(5, LIST_KEYS, f_bytes(1, ""))
    + request(6, MULTI_GET, f_bytes(1, "state") + f_bytes(1, "none")),
    "wait_limit": AUTHENTICATED_BIG_CHUNKS
    + b"".join(wait(i, ["never/%d" % i], 1000) for i in range(1, 19)),
    "write_batch": AUTHENTICATED_MID_CHUNKS
    + wait(1, ["gen/1/changes"], 1000)
    + batch(2, [("cas", "gen/1/claim", None, "c"), ("set", "gen/1/table", "t"),
                ("set", "gen/1/changes", "x"), ("fence", 1), ("set", "current", "1")], 1)
    + batch(3, [("set", "k", "1"), ("set", "k", "2")])
    + batch(4, [("set", "late", "v")], 0)
    + batch(5, [("fence", 2), ("fence", 3)]),
    "multi_get_with_ages": AUTHENTICATED_MID_CHUNKS
    + set_(1, "agents/hb/h0", "1")
    + add(2, "agents/hb/h1", 1)
    + request(3, MULTI_GET, f_bytes(1, "agents/hb/h0") + f_bytes(1, "absent") + f_varint(2, 1))
    + request(4, DELETE, f_bytes(1, "agents/hb/h0"))
    + request(5, MULTI_GET, f_bytes(1, "agents/hb/h0") + f_bytes(1, "agents/hb/h1") + f_varint(2, 1)),
    "empty_key": AUTHENTICATED_MID_CHUNKS + set_(1, "", "v"),
    "unknown_op": AUTHENTICATED_MID_CHUNKS + frame(f_bytes(3, f_varint(1, 9) + f_varint(99, 1))),
    "zero_request_id": AUTHENTICATED_MID_CHUNKS + get(0, "k"),
    "handshake_bad_proof": FRESH + hello() + proof(),
    "handshake_job_b": FRESH + hello(job="job-b") + proof(),
    "handshake_bad_version": FRESH + hello(version=7),
    "handshake_short_nonce": FRESH + hello(nonce=b"short"),
    "handshake_bad_job": FRESH + hello(job="bad job\n"),
    "request_before_auth": FRESH + get(1, "secret"),
    "proof_before_hello": FRESH + proof(),
    "oversized_prefix": FRESH + b"\xff\xff\xff\xff",
    "garbage": FRESH + b"GET / HTTP/1.1\r\n\r\n",
    "unparsable": AUTHENTICATED_MID_CHUNKS + frame(b"\xff" * 8),
    "empty_frame": AUTHENTICATED_MID_CHUNKS + frame(b""),
}


def main():
    corpus = os.path.join(HERE, "corpus")
    os.makedirs(corpus, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(SEEDS), corpus))


if __name__ == "__main__":
    main()
