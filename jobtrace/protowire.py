"""Protocol Buffers wire-format pieces shared by the encoders that write protobuf by hand.

Two encoders need them (Prometheus remote-write in :mod:`metrics`, the Perfetto trace in
:mod:`queries`): both write a handful of message kinds at rates where building generated
``_pb2`` messages would cost more than the work itself, so each splices bytes; the varint is
the one piece they share, and it lives here so both follow the same rule for negative numbers.
"""

from __future__ import annotations

__all__ = ["varint"]


def varint(n: int) -> bytes:
    """``n`` as a base-128 varint; a negative ``n`` as protobuf writes an int64 (two's complement, ten bytes)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
