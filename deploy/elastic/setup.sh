#!/bin/sh
# Entry point of the `setup` service: install jobtrace from the repository mounted read-only at
# /src (copied first: pip builds in the source tree), then run `jobtrace setup "$@"`.
set -eu
mkdir -p /tmp/jobtrace
cd /src
for part in pyproject.toml README.md jobtrace otel_instrumentation shippers queries kibana ingest loki; do
  if [ -e "$part" ]; then cp -r "$part" /tmp/jobtrace/; fi
done
pip install --quiet --no-cache-dir --disable-pip-version-check --root-user-action=ignore "/tmp/jobtrace[elasticsearch]"
exec jobtrace setup "$@"
