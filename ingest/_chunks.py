"""The chunk reader: a byte stream read in chunks, turned into runs of whole lines, with one set of rules.

Both passes of an ingest (the alignment pass and the main one, compiled lane or not) read
their input through it, so that they see the same lines:

* a line is what ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (a progress bar's refresh); a
  ``\\r`` that ends a chunk is held back with the carry, as the ``\\r\\n`` it may begin;
* the partial last line of a chunk is carried over to the next one;
* a line longer than ``max_line`` bytes is cut there (its head is kept, marked truncated)
  and the rest of it, up to its end, is dropped, so memory stays bounded;
* the final unterminated line is given by :meth:`ChunkReader.finish`.

Runs are ``(buf, begin, end, truncated)``: the lines are ``buf[begin:end]`` joined by
``\\n``. Where the chunk needs no rewriting they lie in the chunk itself (a copy of
megabytes costs its pages anew each time), the line begun in the last chunk on its own;
``joined=True`` asks for that line and the chunk's whole lines as one run.
"""

from __future__ import annotations

__all__ = ["ChunkReader", "Run"]

Run = tuple[bytes, int, int, bool]
"""``(buf, begin, end, truncated)``: whole lines ``buf[begin:end]``; truncated: one line cut at the limit."""


class ChunkReader:
    """The reading state of one input: the carried partial line and whether an over-long line is being dropped."""

    __slots__ = ("max_line", "carry", "discard")

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self.carry = b""
        self.discard = False  # inside an over-long line: drop up to its end

    def feed(self, data: bytes, joined: bool = False) -> list[Run]:
        """The runs of whole lines that ``data`` (the next chunk) completes, in order."""
        maxb = self.max_line
        cut = data.rfind(b"\n")
        if (not self.discard and cut >= 0 and len(data) - cut - 1 <= maxb and b"\r" not in data
                and not self.carry.endswith(b"\r")):
            runs: list[Run] = []
            begin = 0
            if self.carry:
                if joined:
                    block = self.carry + data[:cut]
                    self.carry = data[cut + 1:]
                    return [(block, 0, len(block), False)]
                first = data.find(b"\n")
                line = self.carry + data[:first]
                runs.append((line, 0, len(line), False))
                begin = first + 1
            if cut >= begin:
                runs.append((data, begin, cut, False))
            self.carry = data[cut + 1:]
            return runs
        return self._general(data, maxb)

    def _general(self, data: bytes, maxb: int) -> list[Run]:
        """:meth:`feed` where the chunk is rewritten (carriage returns) or a line is over-long."""
        if b"\r" in data:
            if data.endswith(b"\r"):
                data, extra = data[:-1], b"\r"
            else:
                extra = b""
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            extra = b""
        if self.carry:
            if self.carry.endswith(b"\r"):  # the CR held back: a line end, with the LF after it if one follows
                data = self.carry[:-1] + b"\n" + (data[1:] if data.startswith(b"\n") else data)
            else:
                data = self.carry + data
            self.carry = b""
        cut = data.rfind(b"\n")
        if self.discard:
            if cut < 0:
                self.carry = extra
                return []
            data = data[data.find(b"\n") + 1:]
            self.discard = False
            cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > maxb:
                self.discard = True
                self.carry = extra
                return [(data, 0, maxb, True)]
            self.carry = data + extra
            return []
        if len(data) - cut - 1 > maxb:
            self.discard = True
            self.carry = extra
            return [(data, 0, cut, False), (data, cut + 1, cut + 1 + maxb, True)]
        self.carry = data[cut + 1:] + extra
        return [(data, 0, cut, False)]

    def finish(self) -> Run | None:
        """The final unterminated line (truncated: the end of an over-long one), or ``None``."""
        if not self.carry and not self.discard:
            return None
        tail, self.carry = self.carry, b""
        if tail.endswith(b"\r"):  # a CR held back at the very end ended the line
            tail = tail[:-1]
        truncated, self.discard = self.discard, False
        return tail, 0, len(tail), truncated
