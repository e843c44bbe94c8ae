"""Keeping secrets out of what jobtrace prints and ships.

Two parts, one module, so there is one place that decides what is secret:

* **jobtrace's own URLs** in messages, errors and reports. Users paste URLs with
  credentials in them (``https://user:pw@es:9200``) or tokens in the query string
  (``?access_token=…``, presigned ``X-Amz-Signature=…``); every such URL goes through
  :func:`redact_url` (the URL whole, user info and secret parameters masked: errors) or
  :func:`url_for_display` (scheme, host, port and path only: reports and summaries).
* **secrets in the events themselves** (:class:`Redactor`): a training log prints an
  ``hf_…`` token, a ``WANDB_API_KEY=…``, a database URL with its password. Every encoded
  event line is redacted on its way to the sinks (the export thread of a traced process,
  the writer of an ingest, ``jobtrace export``), the embedded store included, unless
  ``JOBTRACE_REDACT=0``: the secret *value* becomes ``[REDACTED:<kind>]`` and the key
  that named it stays (``password=[REDACTED:password]``, ``Bearer [REDACTED:bearer]``).

How :class:`Redactor` stays cheap and safe (it runs on every line a job writes):

* It works on the encoded JSON line, so the compiled recorder's and the ingest lane's
  buffers are redacted as they are, without decoding. Values never take in a quote or a
  backslash that ends or escapes a string (``\\n`` inside a key block is taken whole), so a
  redacted line is still valid JSON with the same keys.
* A prefilter finds the few lines that may hold a secret: one Hyperscan pass over a whole
  batch for every trigger at once where Hyperscan is installed (a dependency on x86-64),
  else a search for each trigger word in the lower-cased batch. Only those lines meet
  the patterns; a batch with none goes on as it is, the same object.
* Every pattern is linear in the length of the line: no quantifier inside another, the
  long runs possessive (``++``), the rest bounded, so an adversarial megabyte line of
  ``password=password=…`` or of ``hf_hf_hf_…`` costs what its length costs.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import config
from .errors import ConfigError

__all__ = [
    "DEFAULT_KINDS",
    "MASK",
    "RedactState",
    "Redactor",
    "UserPattern",
    "is_secret_name",
    "redact_url",
    "redactor_from_env",
    "url_for_display",
]

MASK: Final = "***"
"""What stands where a secret was."""

_SECRET_NAME: Final = re.compile(
    r"(token|secret|passw(or)?d|pass|pwd|api[-_]?key|apikey|auth|credential|signature|sig|session|key)$",
    re.IGNORECASE,
)
"""Query parameter names that carry secrets: ``access_token``, ``api_key``, ``X-Amz-Signature``,
``X-Amz-Credential``, ``sig``, ``password``… (matched at the end of the name, any case)."""


def is_secret_name(name: str) -> bool:
    """Whether a parameter or header called ``name`` holds a secret."""
    return bool(_SECRET_NAME.search(name.replace("-", "_")))


def _netloc(host: str | None, port: int | None) -> str:
    return (host or "") + (f":{port}" if port else "")


def redact_url(url: str) -> str:
    """``url`` with its user info masked and secret query parameters replaced by :data:`MASK`."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # not a URL we can take apart (a bad port, say): show nothing of it that could leak
        return url.split("@")[-1].split("?")[0]
    netloc = parts.netloc
    if parts.username or parts.password:
        netloc = f"{MASK}@{_netloc(parts.hostname, port)}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(k) for k, _ in pairs):
            query = urlencode([(k, MASK if is_secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def url_for_display(url: str) -> str:
    """A URL fit for reports and summaries: scheme, host, port and path; no credentials, no query."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url.split("@")[-1].split("?")[0]
    return urlunsplit((parts.scheme, _netloc(parts.hostname, port), parts.path, "", ""))


# ---- secrets in event lines ------------------------------------------------------------------------------
#
# A rule is an anchor (words found with ``bytes.find`` in the lower-cased text: C speed, no regex scan) and a
# pattern matched only where an anchor is (``.match``), which says what the value is. The patterns read the
# *encoded* line: a quote inside a message is ``\"``, a newline ``\n``. A value never takes in a quote or a
# backslash that is not part of it, so what it spans is whole JSON escape units of one string.

_NV: Final = (rb"(?![$%*=<\[{(])"
              rb"(?!(?:None|True|False|null|true|false|str|int|bool|bytes|Optional|Union|Any)(?![A-Za-z0-9_]))")
"""What a value must not start with: a placeholder (``$TOKEN``, ``%(pw)s``, ``<HUB_TOKEN>``, ``***``, ``{}``,
``[REDACTED:…]``), a second ``=`` (``password == x``), a Python constant or a type (``token: str``)."""

_VALUE: Final = (
    rb"(?:\"(?P<g1>:\"" + _NV + rb"(?:[^\"\\]|\\.)++)"  # {"password":"x"}: an attribute (JSON itself)
    rb"|(?:\\\"|')?[ ]*[:=][ ]*"  # key=, key:, \"key\": , 'key':
    rb"(?:\\\"(?P<g2>" + _NV + rb"(?:[^\"\\]|\\[^\"\\]|\\\\(?:[^\"\\]|\\.))++)"  # \"x\" (JSON in a message)
    rb"|'(?P<g3>" + _NV + rb"[^'\"\\]++)"  # 'x'
    rb"|(?P<g4>" + _NV + rb"[^\s\"'\\,;&(){}\[\]<>]++)))"  # x
)
_GENERIC: Final = re.compile(rb"(?P<gk>(?i:secret(?:_access_key|[_-]?key)?|api[_-]?key|passw(?:or)?d|passphrase|token))"
                             + _VALUE)
_CLI: Final = re.compile(rb"(?i:passw(?:or)?d|passphrase|token|secret|api[_-]key)[ ]++"
                         rb"(?P<g4>" + _NV + rb"(?!-)[^\s\"'\\,;]++)")
_CLI_FLAG: Final = re.compile(rb"--[A-Za-z_-]{0,24}\Z")
"""``--password x``, ``--hub-token x``: a command line echoed in a log (the word after the flag)."""

_SPECIAL_TOKENS: Final = (b"eos_", b"bos_", b"pad_", b"unk_", b"sep_", b"cls_", b"mask_", b"image_", b"start_",
                          b"end_", b"special_")
"""A tokenizer's special tokens (``eos_token='</s>'``) are not secrets."""

_PATTERNS: Final = {
    # -----BEGIN RSA PRIVATE KEY-----\n…\n-----END RSA PRIVATE KEY----- (the body, escapes and all)
    "pk": re.compile(rb"-----BEGIN [A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?-----"
                     rb"(?P<v>(?:[^\"\\-]|\\[^\"]|-(?!----END ))*+)"
                     rb"(?P<end>-----END [A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?-----)?"),
    # scheme://user:password@host
    "url": re.compile(rb"://[^\s/@:\"\\]*+:(?P<v>[^\s/@\"\\]++)@"),
    # Authorization: Bearer x / Basic x / x (header dumps; "authorization": "…" in JSON)
    "auth": re.compile(rb"(?i:authorization)(?:\":\"|(?:\\\"|')?[ ]*[:=][ ]*(?:\\\"|')?)(?:(?P<s>[A-Za-z]++)[ ]++)?+"
                       rb"(?P<v>" + _NV + rb"[^\s\"'\\,;]++)"),
    "bearer": re.compile(rb"(?i:bearer)[ ]+(?P<v>[A-Za-z0-9\-._~+/]{8,}+=*+)"),
    # wandb login <key>, wandb.login(key="<key>"): 40 hex digits (after an optional host prefix), or a newer long key
    "wandb": re.compile(rb"(?i:wandb)[ ._-]?(?i:login)(?:[^\"\\]|\\\"){0,64}?(?<![A-Za-z0-9])"
                        rb"(?P<v>(?:[a-z]{2,10}-)?[0-9a-f]{40}(?![A-Za-z0-9])|[A-Za-z0-9_-]{60,}+)"),
    "hf": re.compile(rb"(?P<v>(?:hf_|api_org_)[A-Za-z0-9]{30,}+)"),
    "aws": re.compile(rb"(?<![A-Z0-9])(?P<v>(?:AKIA|ASIA)[A-Z0-9]{16})(?![A-Z0-9])"),
    "gh": re.compile(rb"(?P<v>gh[pousr]_[A-Za-z0-9]{36,}+|github_pat_[A-Za-z0-9_]{40,}+)"),
    "slack": re.compile(rb"(?P<v>xox[abposr]-[A-Za-z0-9-]{10,}+)"),
}
_KIND_OF: Final = {"pk": "private_key", "url": "url_password", "wandb": "wandb_api_key", "hf": "hf_token",
                   "aws": "aws_access_key_id", "gh": "github_token", "slack": "slack_token"}

_RULES: Final[tuple[tuple[str, tuple[bytes, ...]], ...]] = (
    ("pk", (b"-----begin ",)),
    ("url", (b"://",)),
    ("auth", (b"authorization",)),
    ("bearer", (b"bearer",)),
    ("generic", (b"pass", b"secret", b"token", b"api")),
    ("wandb", (b"wandb",)),
    ("hf", (b"hf_", b"api_org_")),
    ("aws", (b"akia", b"asia")),
    ("gh", (b"gh", b"github_pat_")),
    ("slack", (b"xox",)),
)
"""The rules in the order they win a tie, each with its anchors (lower case: found in the lower-cased text)."""
_RULE_INDEX: Final = {name: i for i, (name, _) in enumerate(_RULES)}

_HS_TRIGGERS: Final[tuple[tuple[str, bytes, bool], ...]] = (
    ("pk", rb"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY", False),
    ("url", rb"://[^\s/@:\"\\]*:[^\s/@\"\\]+@", False),
    ("auth", rb"authorization(?:\\?\"|')?[ ]*[:=]", True),
    ("bearer", rb"bearer[ ]+[A-Za-z0-9\-._~+/]{8}", True),
    ("generic", rb"--[a-z_-]{0,24}(?:passw(?:or)?d|passphrase|token|secret|api[_-]key)[ ]", True),
    ("generic", rb"(?:secret(?:_access_key|[_-]?key)?|api[_-]?key|passw(?:or)?d|passphrase|token)(?:\\?\"|')?[ ]*[:=]",
     True),
    ("wandb", rb"wandb[ ._-]?login", True),
    ("hf", rb"(?:hf_|api_org_)[A-Za-z0-9]{30}", False),
    ("aws", rb"(?:AKIA|ASIA)[A-Z0-9]{16}", False),
    ("gh", rb"gh[pousr]_[A-Za-z0-9]{36}", False),
    ("gh", rb"github_pat_[A-Za-z0-9_]{40}", False),
    ("slack", rb"xox[abposr]-[A-Za-z0-9-]{10}", False),
)
"""Hyperscan's triggers, one pass over a whole batch for all of them: each match of a rule holds one of its
rule's triggers (a looser form of it, without lookarounds), so only the lines they hit meet the rules."""

DEFAULT_KINDS: Final = ("private_key", "url_password", "authorization", "bearer", "password", "secret", "token",
                        "api_key", "aws_secret_access_key", "wandb_api_key", "hf_token", "aws_access_key_id",
                        "github_token", "slack_token")
"""What the built-in patterns write after ``REDACTED:``."""

_SHAPES: Final = ((re.compile(rb"(?:hf_|api_org_)[A-Za-z0-9]{30,}"), "hf_token"),
                  (re.compile(rb"(?:gh[pousr]_|github_pat_)[A-Za-z0-9_]{36,}"), "github_token"),
                  (re.compile(rb"xox[abposr]-[A-Za-z0-9-]{10,}"), "slack_token"),
                  (re.compile(rb"(?:AKIA|ASIA)[A-Z0-9]{16}"), "aws_access_key_id"))
"""A key's value that has a known token's shape is named by it (``HF_TOKEN=[REDACTED:hf_token]``)."""

_DOTTED: Final = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)++")
"""``token=args.hf_token`` in a traceback's source line names a variable, not a secret."""

_CONTINUED: Final = re.compile(rb"\"msg\":\"(?P<v>[ ]*+[A-Za-z0-9+/=]*+)"
                               rb"(?:(?P<end>-----END [A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?-----)|(?P<q>(?:\\r)?\"))?")
_PEM_HEADER: Final = re.compile(rb"(?:Proc-Type|DEK-Info|Comment|Version):")
_BLOCK_LINES: Final = 400
"""A key printed line by line (an ingested log file): the lines after an unfinished ``BEGIN … PRIVATE KEY``
whose message is base64 are redacted too, up to the ``END`` line, for at most this many lines."""

_UNIT: Final = re.compile(rb"\\u[0-9A-Fa-f]{4}|\\.")
_JSON_STRING: Final = re.compile(rb"\"(?:[^\"\\]|\\.)*+\"")
_KIND: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

_Found = tuple[int, int, int, int, str, int, bool]
"""A rule's match: start, end, value start, value end, kind, rule order, whether it leaves a key block open."""


def _mark(kind: str) -> bytes:
    return b"[REDACTED:%s]" % kind.encode()


@dataclass(frozen=True)
class UserPattern:
    """A pattern of the user's: what it matches in an encoded line becomes ``[REDACTED:<kind>]``.

    ``regex`` is a Python regular expression over the line as JSON text (a quote is ``\\"``, a newline
    ``\\n``); its group named ``secret``, else its first group, else the whole match, is replaced.
    ``where`` says where it came from (``file:line``), for errors, which never show the pattern itself.
    """

    kind: str
    regex: str
    where: str = "argument"


class RedactState:
    """What a stream of lines carries from one batch to the next: a private key left open by a line."""

    __slots__ = ("open_block", "block_lines")

    def __init__(self) -> None:
        self.open_block = False
        self.block_lines = 0


class _HyperscanScan:
    """The lines a batch's triggers hit, with the rules they are for, in one Hyperscan pass."""

    def __init__(self) -> None:
        import hyperscan

        self._hs = hyperscan
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(expressions=[t for _, t, _ in _HS_TRIGGERS],
                         ids=[_RULE_INDEX[name] for name, _, _ in _HS_TRIGGERS], elements=len(_HS_TRIGGERS),
                         flags=[hyperscan.HS_FLAG_CASELESS if caseless else 0 for _, _, caseless in _HS_TRIGGERS])
        self._local = threading.local()  # a scratch space per thread (the export thread, a spilling caller)

    def hits(self, data: bytes) -> list[tuple[int, int]]:
        """``(offset, rule)`` of every trigger's match (the offset of its last byte)."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._hs.Scratch(self._db)
        found: list[tuple[int, int]] = []
        append = found.append

        def hit(rule: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            append((end - 1, rule))

        self._db.scan(data, match_event_handler=hit, scratch=scratch)
        return found


def _hyperscan_available() -> bool:
    try:
        import hyperscan  # noqa: F401
    except ImportError:
        return False
    return True


def _rule_matches(data: bytes, low: bytes, base: int, rule: int, out: list[_Found]) -> None:
    """Every match of ``rule`` whose anchor lies in ``low`` (``data[base:base + len(low)]`` lower-cased)."""
    name, anchors = _RULES[rule]
    pattern = _PATTERNS.get(name)
    for anchor in anchors:
        i = low.find(anchor)
        while i >= 0:
            k = base + i
            found = _generic(data, k, rule) if pattern is None else _simple(pattern, name, data, k, rule)
            if found is not None:
                out.append(found)
                i = low.find(anchor, found[1] - base)  # after the match: a long value is read once
            else:
                i = low.find(anchor, i + 1)


def _simple(pattern: re.Pattern[bytes], name: str, data: bytes, k: int, rule: int) -> _Found | None:
    m = pattern.match(data, k)
    if m is None:
        return None
    vs, ve = m.span("v")
    kind = _KIND_OF.get(name, "")
    if name == "auth":
        scheme = m.group("s")
        kind = "bearer" if scheme is not None and scheme.lower() == b"bearer" else "authorization"
    elif name == "bearer":
        value = data[vs:ve]
        if value.isalpha() and value.islower():  # prose: "a bearer authentication scheme"
            return None
        kind = "bearer"
    return m.start(), m.end(), vs, ve, kind, rule, name == "pk" and m.group("end") is None


def _generic(data: bytes, k: int, rule: int) -> _Found | None:
    """``password=x``, ``"token": "x"``, ``'api_key': 'x'``, ``SECRET: x``, ``--password x`` at ``k``."""
    m = _GENERIC.match(data, k)
    if m is not None:
        key = m.group("gk").lower()
        for g in ("g1", "g2", "g3", "g4"):
            vs, ve = m.span(g)
            if vs >= 0:
                break
        if g == "g1":
            vs += 2  # past :"
    else:
        flag = _CLI_FLAG.search(data, max(0, k - 26), k)
        m = _CLI.match(data, k) if flag is not None else None
        if m is None:
            return None
        key = data[k:m.start("g4")].rstrip(b" ").lower()
        g = "g4"
        vs, ve = m.span(g)
    value = data[vs:ve]
    before = data[max(0, k - 8):k].lower()
    if key.startswith(b"secret_access"):
        kind = "aws_secret_access_key" if before.endswith(b"aws_") else "secret"
    elif key.startswith(b"api"):
        kind = "wandb_api_key" if before.endswith((b"wandb_", b"wandb-")) else "api_key"
    elif key.startswith(b"secret"):
        kind = "secret"
    elif key.startswith(b"token"):
        if value.isdigit() or before.endswith(_SPECIAL_TOKENS):  # token: 5 of 512; eos_token='</s>'
            return None
        kind = "token"
    else:
        kind = "password"
    if g == "g4" and _DOTTED.fullmatch(value):
        return None
    for shape, name in _SHAPES:
        if shape.fullmatch(value):
            kind = name
            break
    return k, m.end(), vs, ve, kind, rule, False


class Redactor:
    """Replaces secrets in encoded event lines with ``[REDACTED:<kind>]``; thread-safe.

    Args:
        patterns: the user's patterns (:class:`UserPattern`, or ``(kind, regex)`` pairs), besides the built-in ones.
        defaults: use the built-in patterns (the kinds of :data:`DEFAULT_KINDS`).
        hyperscan: prefilter with Hyperscan (``None``: where it is installed; ``False``: find the anchors
            in the whole batch, which costs several times more).

    Raises :class:`ConfigError` for a pattern that does not compile or matches empty text (naming its
    kind and where it came from, never the pattern).
    """

    def __init__(self, patterns: Iterable[UserPattern | tuple[str, str]] = (), *, defaults: bool = True,
                 hyperscan: bool | None = None) -> None:
        self.defaults = defaults
        self.user: tuple[UserPattern, ...] = tuple(p if isinstance(p, UserPattern) else UserPattern(p[0], p[1])
                                                   for p in patterns)
        self._user: list[tuple[re.Pattern[bytes], bytes, int | str]] = [self._compile(p) for p in self.user]
        self._use_hyperscan = _hyperscan_available() if hyperscan is None else hyperscan
        self._hs: _HyperscanScan | None = None
        self._ready = False
        self._lock = threading.Lock()

    @staticmethod
    def _compile(p: UserPattern) -> tuple[re.Pattern[bytes], bytes, int | str]:
        if not _KIND.fullmatch(p.kind):
            raise ConfigError(f"redaction pattern at {p.where}: the kind must be 1-64 letters, digits or _.:- "
                              f"(it is written into every line it redacts)")
        try:
            rx = re.compile(p.regex.encode())
        except re.error as exc:
            raise ConfigError(f"redaction pattern {p.kind!r} at {p.where} is not a valid regular expression "
                              f"({exc.msg} at position {exc.pos})") from None
        if rx.match(b"") is not None:
            raise ConfigError(f"redaction pattern {p.kind!r} at {p.where} matches empty text")
        group: int | str = "secret" if "secret" in rx.groupindex else 1 if rx.groups else 0
        return rx, _mark(p.kind), group

    @property
    def engine(self) -> str:
        """How the lines to look at are found: ``hyperscan`` (one pass for every trigger) or ``re``."""
        return "hyperscan" if self._prefilter() is not None else "re"

    def _prefilter(self) -> _HyperscanScan | None:
        if not self._ready:  # built on first use, on the export thread: Hyperscan compiles for tens of ms
            with self._lock:
                if not self._ready:
                    if self._use_hyperscan:
                        try:
                            self._hs = _HyperscanScan()
                        except Exception:  # noqa: BLE001 - not installed, or a build that cannot compile them
                            self._hs = None
                    self._ready = True
        return self._hs

    # ---- the API ------------------------------------------------------------------------------------------
    def redact(self, data: bytes, state: RedactState | None = None) -> bytes:
        """``data`` (whole event lines) with every secret replaced; ``data`` itself when there is none.

        ``state`` carries a private key printed line by line from one call to the next (one per stream).
        """
        if not data:
            return data
        found = self._builtin(data) if self.defaults else []
        if found or (state is not None and state.open_block):
            found = self._resolve(data, found, state if state is not None else RedactState())
        new = _replace(data, found) if found else data
        for rx, mark, group in self._user:
            new = _user_pass(rx, mark, group, new)
        return new

    def redact_lines(self, items: list[bytes], state: RedactState | None = None) -> list[bytes]:
        """A batch of items (each one line, or whole lines): ``items`` itself when nothing was secret, else
        one item per line."""
        if not items:
            return items
        data = items[0] if len(items) == 1 else b"".join(items)
        new = self.redact(data, state)
        if new is data:
            return items
        lines = new.split(b"\n")
        last = lines.pop()
        out = [line + b"\n" for line in lines]
        if last:
            out.append(last)
        return out

    def redact_text(self, text: str) -> str:
        """Plain text (a message, an error) with its secrets replaced, as a line would have them."""
        import orjson

        data = orjson.dumps(text)
        new = self.redact(data)
        return text if new is data else str(orjson.loads(new))

    # ---- finding -------------------------------------------------------------------------------------------
    def _builtin(self, data: bytes) -> list[_Found]:
        found: list[_Found] = []
        hs = self._prefilter()
        if hs is None:  # every anchor in the whole batch
            low = data.lower()
            for rule in range(len(_RULES)):
                _rule_matches(data, low, 0, rule, found)
            return found
        hits = hs.hits(data)
        if not hits:
            return found
        hits.sort()
        n = len(data)
        end = -1
        lines: list[tuple[int, int, set[int]]] = []
        for offset, rule in hits:  # the lines hit, each with the rules its triggers are for
            if offset < end:
                lines[-1][2].add(rule)
                continue
            start = data.rfind(b"\n", 0, offset) + 1
            nl = data.find(b"\n", offset)
            end = n if nl < 0 else nl + 1
            lines.append((start, end, {rule}))
        for start, end, rules in lines:
            low = data[start:end].lower()
            for rule in sorted(rules):
                _rule_matches(data, low, start, rule, found)
        return found

    @staticmethod
    def _resolve(data: bytes, found: list[_Found], state: RedactState) -> list[_Found]:
        """The matches to apply, in order and apart (the earliest wins, then the rule first in :data:`_RULES`),
        and the lines of a key block left open, from ``state`` and from these lines."""
        found.sort(key=lambda f: (f[0], f[5]))
        kept: list[_Found] = []
        end = -1
        for f in found:
            if f[0] >= end:
                kept.append(f)
                end = f[1]
        opened = [data.find(b"\n", f[1]) for f in kept if f[6]]
        starts = ([0] if state.open_block else []) + [nl + 1 for nl in opened if nl >= 0]
        if opened and opened[-1] < 0:  # the last line opened a block and the batch ends there
            state.open_block, state.block_lines = True, 0
        if not starts:
            return kept
        more: list[_Found] = []
        n = len(data)
        for ls in starts:
            if ls != 0 or not state.open_block:
                state.open_block, state.block_lines = True, 0
            while ls < n and state.open_block:
                nl = data.find(b"\n", ls)
                le = n if nl < 0 else nl + 1
                span = _continue_block(data, ls, le, state)
                if span is not None:
                    more.append((span[0], span[1], span[0], span[1], "private_key", -1, False))
                ls = le
        if not more:
            return kept
        merged: list[_Found] = []
        end = -1
        for f in sorted(kept + more, key=lambda f: (f[0], f[5])):
            if f[0] >= end:
                merged.append(f)
                end = f[1]
        return merged


def _continue_block(data: bytes, ls: int, le: int, state: RedactState) -> tuple[int, int] | None:
    """A line after an unfinished key block: the span of its base64 message, or ``None`` (perhaps closing it)."""
    state.block_lines += 1
    m = _CONTINUED.search(data, ls, le)
    if m is None or state.block_lines > _BLOCK_LINES:
        state.open_block = False
        return None
    vs, ve = m.span("v")
    if m.group("end") is not None:
        state.open_block = False
    elif m.group("q") is None:  # other text: a PEM header keeps the block open, anything else ends it
        if _PEM_HEADER.match(data, vs) is None:
            state.open_block = False
        return None
    return (vs, ve) if vs < ve else None


def _replace(data: bytes, found: list[_Found]) -> bytes:
    parts: list[bytes] = []
    pos = 0
    for _, _, vs, ve, kind, _, _ in found:
        if vs < ve:  # a key block's empty first line only opens the block
            parts += (data[pos:vs], _mark(kind))
            pos = ve
    if not parts:
        return data
    parts.append(data[pos:])
    return b"".join(parts)


def _user_pass(rx: re.Pattern[bytes], mark: bytes, group: int | str, data: bytes) -> bytes:
    """``data`` with a user pattern applied to each line it matches in."""
    m = rx.search(data)
    if m is None:
        return data
    parts: list[bytes] = []
    pos = 0
    n = len(data)
    while m is not None:
        ls = data.rfind(b"\n", 0, m.start()) + 1
        nl = data.find(b"\n", m.start())
        le = n if nl < 0 else nl + 1
        line = data[ls:le]
        new = _user_sub(rx, mark, group, line)
        if new is not line:
            parts += (data[pos:ls], new)
            pos = le
        m = rx.search(data, le) if le < n else None
    if not parts:
        return data
    parts.append(data[pos:])
    return b"".join(parts)


_STRUCTURAL: Final = frozenset({b"kind", b"job", b"trace_id", b"node", b"span_id", b"parent_id", b"level", b"cat"})
"""Keys whose string values jobtrace itself writes and reads back (identity and structure): a user pattern
never rewrites them, nor any key."""


def _value_strings(line: bytes) -> list[tuple[int, int]]:
    """(start, end) of the content of each JSON string of ``line`` a user pattern may rewrite: values only."""
    out: list[tuple[int, int]] = []
    key = b""
    for m in _JSON_STRING.finditer(line):
        a, b = m.start() + 1, m.end() - 1
        if line[m.end():m.end() + 1] == b":":
            key = line[a:b]
        elif key not in _STRUCTURAL:
            out.append((a, b))
    return out


def _user_sub(rx: re.Pattern[bytes], mark: bytes, group: int | str, line: bytes) -> bytes:
    """``line`` with ``rx``'s matches replaced, each widened to whole escape units and UTF-8 characters and kept
    inside one string."""
    spans = []
    for m in rx.finditer(line):
        s, e = m.span(group)
        if s < e:
            spans.append((s, e))
    if not spans:
        return line
    strings = _value_strings(line)
    if not strings:
        return line
    starts = [a for a, _ in strings]
    units = [(m.start(), m.end()) for m in _UNIT.finditer(line)]
    ustarts = [a for a, _ in units]
    parts: list[bytes] = []
    pos = 0
    for s, e in spans:
        i = bisect_right(starts, s) - 1
        if i < 0 or s >= strings[i][1]:  # not inside a string: start at the next one the match reaches
            i += 1
            if i >= len(strings) or strings[i][0] >= e:
                continue
            s = strings[i][0]
        e = min(e, strings[i][1])
        j = bisect_right(ustarts, s) - 1
        if j >= 0 and units[j][0] < s < units[j][1]:
            s = units[j][0]
        j = bisect_right(ustarts, e - 1) - 1
        if j >= 0 and units[j][0] <= e - 1 < units[j][1]:
            e = units[j][1]
        while s > 0 and 0x80 <= line[s] < 0xC0:  # whole UTF-8 characters: never half of an "é"
            s -= 1
        while e < len(line) and 0x80 <= line[e] < 0xC0:
            e += 1
        if s < pos or s >= e:
            continue
        parts += (line[pos:s], mark)
        pos = e
    if not parts:
        return line
    parts.append(line[pos:])
    return b"".join(parts)


_default_lock = threading.Lock()
_defaults: dict[tuple[Any, ...], Redactor] = {}


def redactor_from_env(env: Mapping[str, str] | None = None,
                      extra: Iterable[UserPattern | tuple[str, str]] = (), *, force: bool = False) -> Redactor | None:
    """The redactor the environment asks for (``JOBTRACE_REDACT``, ``JOBTRACE_REDACT_PATTERNS``), or ``None``
    when redaction is off; ``extra`` patterns are added, and ``force`` turns it on whatever the variable says.

    One redactor per distinct configuration is kept for the process (compiling costs milliseconds).
    """
    settings = config.RedactSettings.from_env(env)
    if not (settings.enabled or force):
        return None
    patterns = tuple(UserPattern(kind, regex, where) for kind, regex, where in settings.patterns)
    patterns += tuple(p if isinstance(p, UserPattern) else UserPattern(p[0], p[1]) for p in extra)
    key = tuple((p.kind, p.regex) for p in patterns)
    with _default_lock:
        found = _defaults.get(key)
        if found is None:
            found = _defaults[key] = Redactor(patterns)
    return found

