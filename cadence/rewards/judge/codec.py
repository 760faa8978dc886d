"""Plain data of exact built-in types as tagged JSON, both ways: the first part of the judge's
program and of its zygote's (judge/__init__.py). Exact types (`type(v) is int`), not
isinstance: a subclass with its own __eq__ is not plain data. Standard library only."""

import _json


class _Decoder:  # what _json's scanner asks of a decoder (the json package, with re, costs more)
    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int

    def parse_constant(name):
        raise ValueError(f"not plain JSON: {name}")


_scan = _json.make_scanner(_Decoder)


def loads(text):
    value, end = _scan(text, 0)
    if end != len(text):
        raise ValueError("not one JSON value")
    return value


def dumps(v):
    t = type(v)
    if t is str:
        return _json.encode_basestring_ascii(v)
    if v is None or t is bool:
        return {None: "null", True: "true", False: "false"}[v]
    if t is int:
        return int.__repr__(v)
    if t is list or t is tuple:
        return "[" + ",".join([dumps(x) for x in v]) + "]"
    if t is dict:
        return "{" + ",".join([dumps(k) + ":" + dumps(x) for k, x in v.items()]) + "}"
    raise TypeError(f"cannot send a {t.__name__}")


SEQS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
KINDS = {tag: kind for kind, tag in SEQS.items()}


def encode(v, other, depth=0):
    t = type(v)
    if v is None:
        return ["n"]
    if t is bool or t is str:
        return ["b" if t is bool else "s", v]
    if t is int:
        return ["i", format(v, "x")]
    if t is float:
        return ["f", v.hex()]
    if t is complex:
        return ["c", v.real.hex(), v.imag.hex()]
    if t is bytes:
        return ["y", v.hex()]
    if depth < 50 and t in SEQS:
        return [SEQS[t], [encode(x, other, depth + 1) for x in v]]
    if depth < 50 and t is dict:
        return ["d", [[encode(k, other, depth + 1), encode(x, other, depth + 1)] for k, x in v.items()]]
    return other(v)  # not plain data: the worker keeps it (a handle), the judge refuses it


def decode(e, handle):
    tag = e[0]
    if tag == "h":
        return handle(int(e[1]))
    if tag == "d":
        return {decode(k, handle): decode(x, handle) for k, x in e[1]}
    if tag in KINDS:
        return KINDS[tag](decode(x, handle) for x in e[1])
    if tag == "n":
        return None
    if tag in ("b", "s"):
        return (bool if tag == "b" else str)(e[1])
    if tag == "i":
        return int(str(e[1]), 16)
    if tag == "f":
        return float.fromhex(str(e[1]))
    if tag == "c":
        return complex(float.fromhex(str(e[1])), float.fromhex(str(e[2])))
    if tag == "y":
        return bytes.fromhex(str(e[1]))
    raise ValueError(f"unknown tag {tag!r}")
