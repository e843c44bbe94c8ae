"""jobtrace's Loki assets: the named LogQL query library, alert rules and Grafana provisioning.

    import loki
    lib = loki.library()
    lib.render("step_durations", job="my-job", rank=[2, 3], window="1m")
    lib.grafana("step_durations")      # the same query with $job, $node, $rank, $__auto
    loki.library(loki.job_label())     # on the label JOBTRACE_LOKI_JOB_LABEL names (old data: ``job``)
    lib.names(); lib["errors"].answers # what each query answers

The library (``queries.yaml`` next to this file) is the only place a query is written:
the dashboards under ``grafana/`` and the ruler rules under ``rules/`` are generated
from it (``python -m loki build``; a test fails when they drift), and
``trace-job --backend loki`` fetches with it.

Every value that comes from a user (job ids, node names, ranks) is escaped twice over:
as a literal inside an RE2 regex (the library matches labels with ``=~`` so that
dashboards can select several values) and then as a LogQL string.

The job id is in the stream label ``training_job`` (``JOB_LABEL``), not ``job``, which
Promtail and Prometheus give the scrape job in a Loki shared with them. Durations and
numbers are validated, not escaped. So a hostile job id cannot change a query.
"""

from __future__ import annotations

from ._library import ASSETS, Alert, Query, QueryLibrary, Regex, job_label, library, re2_escape, valid_job_label
from ._logql import JOB_LABEL, LABEL_KEYS, METADATA_KEYS, is_label_name, label_string, logql_quote, logsql_quote

__all__ = [
    "ASSETS",
    "Alert",
    "JOB_LABEL",
    "LABEL_KEYS",
    "METADATA_KEYS",
    "Query",
    "QueryLibrary",
    "Regex",
    "is_label_name",
    "job_label",
    "label_string",
    "library",
    "logql_quote",
    "logsql_quote",
    "re2_escape",
    "valid_job_label",
]
