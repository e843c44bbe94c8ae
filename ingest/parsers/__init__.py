"""The built-in parsers, one module per source, and the default registry order.

Order matters only for a line that triggers several parsers: the specific formats
(OTLP/JSON documents first: whole span batches, never a log line) come first, the failure evidence next, the generic ``step N loss x`` reader last.
"""

from __future__ import annotations

from .._types import ParserRegistry
from .apex import ApexParser
from .deepspeed import DeepSpeedParser
from .generic import GenericStepParser
from .huggingface import HuggingFaceParser
from .megatron import MegatronParser
from .mmengine import MmengineParser
from .otlp import OtlpSpanParser
from .torch_distributed import ElasticFailureParser, NcclParser, OomParser, TracebackParser, WatchdogParser

__all__ = [
    "ApexParser",
    "DeepSpeedParser",
    "ElasticFailureParser",
    "GenericStepParser",
    "HuggingFaceParser",
    "MegatronParser",
    "MmengineParser",
    "NcclParser",
    "OtlpSpanParser",
    "OomParser",
    "TracebackParser",
    "WatchdogParser",
    "builtin_registry",
]


def builtin_registry() -> ParserRegistry:
    """A fresh registry holding the built-in parsers in their default order."""
    return ParserRegistry([
        OtlpSpanParser(),
        MegatronParser(),
        DeepSpeedParser(),
        HuggingFaceParser(),
        ApexParser(),
        WatchdogParser(),
        OomParser(),
        NcclParser(),
        TracebackParser(),
        ElasticFailureParser(),
        MmengineParser(),
        GenericStepParser(),
    ])
