"""The chunk reader: a byte stream read in chunks, turned into runs of whole lines, with one set of rules.

Both passes of an ingest (the alignment pass and the main one, compiled lane or not) read
their input through it, so that they see the same lines:

* a line is what ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (a progress bar's refresh); a
  ``\\r`` that ends a chunk is held back with the carry, as the ``\\r\\n`` it may begin;
* the partial last line of a chunk is carried over to the next one;
* a line longer than ``max_line`` bytes is cut there (its head is kept, marked truncated)
  and the rest of it, up to its end, is dropped, so memory stays bounded; its whole length
  is counted on the way and left in ``cut`` once its end is read (carriage returns are
  counted as read, a ``\r\n`` as one byte);
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

    __slots__ = ("max_line", "carry", "discard", "long", "cut")

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self.carry = b""
        self.discard = False  # inside an over-long line: drop up to its end
        self.long = 0  # the bytes of that line so far
        self.cut: list[int] = []  # the lengths of the over-long lines ended since the reader last took them

    def feed(self, data: bytes, joined: bool = False) -> list[Run]:
        """The runs of whole lines that ``data`` (the next chunk) completes, in order."""
        maxb = self.max_line
        cut = data.rfind(b"\n")
        if (not self.discard and cut >= 0 and len(data) - cut - 1 <= maxb and b"\r" not in data
                and not self.carry.endswith(b"\r") and len(data) <= maxb
                and (not self.carry or len(self.carry) + data.find(b"\n") <= maxb)):
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
        starts_lf = data.startswith(b"\n")  # before the rewrite: a CR there is a line end of its own, not a CRLF's LF
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
                data = self.carry[:-1] + b"\n" + (data[1:] if starts_lf else data)
            else:
                data = self.carry + data
            self.carry = b""
        cut = data.rfind(b"\n")
        if self.discard:
            if cut < 0:
                self.long += len(data)
                self.carry = extra
                return []
            end = data.find(b"\n")
            self.cut.append(self.long + end)
            data = data[end + 1:]
            self.discard = False
            cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > maxb:
                self.discard, self.long = True, len(data)
                self.carry = extra
                return [(data, 0, maxb, True)]
            self.carry = data + extra
            return []
        runs = self._whole_lines(data, cut, maxb)
        if len(data) - cut - 1 > maxb:
            self.discard, self.long = True, len(data) - cut - 1
            self.carry = extra
            return [*runs, (data, cut + 1, cut + 1 + maxb, True)]
        self.carry = data[cut + 1:] + extra
        return runs

    def _whole_lines(self, data: bytes, end: int, maxb: int) -> list[Run]:
        """The runs of the whole lines ``data[:end]``, each over-long one cut on its own (its length noted).

        Jumps a window of ``maxb + 1`` bytes at a time: a window that holds a line end holds only
        short lines before it, one that holds none starts an over-long line; so the cost is one
        search per window, not one per line.
        """
        if end <= maxb:
            return [(data, 0, end, False)]
        runs: list[Run] = []
        start = pos = 0  # start: of the run of short lines not yet given; pos: of the line being looked at
        while pos < end:
            window = min(pos + maxb + 1, end + 1)
            last = data.rfind(b"\n", pos, window)
            if last >= 0:
                pos = last + 1
                continue
            if pos > start:
                runs.append((data, start, pos - 1, False))
            eol = data.find(b"\n", pos, end + 1)
            eol = end if eol < 0 else eol
            runs.append((data, pos, pos + maxb, True))
            self.cut.append(eol - pos)
            start = pos = eol + 1
        if start <= end:  # the short lines after the last cut one (an empty last line is a line)
            runs.append((data, start, end, False))
        return runs

    def finish(self) -> Run | None:
        """The final unterminated line, or ``None`` (none, or the end of an over-long one, already given cut)."""
        if not self.carry and not self.discard:
            return None
        tail, self.carry = self.carry, b""
        if tail.endswith(b"\r"):  # a CR held back at the very end ended the line
            tail = tail[:-1]
        truncated, self.discard = self.discard, False
        if truncated:  # the end of an over-long line, whose head was given when it was cut: nothing more to give
            self.cut.append(self.long + len(tail))
            return None
        return tail, 0, len(tail), False
