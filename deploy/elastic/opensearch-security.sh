#!/bin/bash
# Entry point of the `opensearch` service of compose.opensearch.yaml: OpenSearch with its security
# plugin on and no default password anywhere, then the image's own entry point.
#
# 1. The image's demo installer (install_demo_configuration.sh, as the image runs it itself) gives
#    the node its transport TLS certificates and security settings, and checks that
#    OPENSEARCH_INITIAL_ADMIN_PASSWORD is strong; it does nothing once the node is configured.
# 2. The demo's other users come with passwords published in its documentation, so
#    internal_users.yml is replaced by two users only: `admin` (OPENSEARCH_INITIAL_ADMIN_PASSWORD)
#    and `kibanaserver`, OpenSearch Dashboards' server user (OPENSEARCH_DASHBOARDS_PASSWORD), each
#    hashed here by the plugin's own hash tool (read from the environment, never a command line).
#
# The security index is created from these files on the first start only (the data volume keeps
# it): to change a password later, use the security REST API or securityadmin.sh, or start over
# with `docker compose -f deploy/elastic/compose.opensearch.yaml down -v`.
set -euo pipefail
: "${OPENSEARCH_INITIAL_ADMIN_PASSWORD:?set OPENSEARCH_ADMIN_PASSWORD (OpenSearch has no default password here)}"
: "${OPENSEARCH_DASHBOARDS_PASSWORD:?set OPENSEARCH_DASHBOARDS_PASSWORD (the kibanaserver user; no default)}"
cd /usr/share/opensearch
tools=plugins/opensearch-security/tools
export OPENSEARCH_JAVA_HOME="${OPENSEARCH_JAVA_HOME:-/usr/share/opensearch/jdk}"

bash "$tools/install_demo_configuration.sh" -y -i -s

hash_of() {   # the bcrypt hash of the password in the environment variable named $1
  local out
  out="$(bash "$tools/hash.sh" -env "$1" | tail -n 1)"
  case "$out" in
    '$2'*) printf '%s' "$out" ;;
    *) echo "opensearch-security.sh: hash.sh gave no bcrypt hash for $1" >&2; return 1 ;;
  esac
}
admin_hash="$(hash_of OPENSEARCH_INITIAL_ADMIN_PASSWORD)"
dashboards_hash="$(hash_of OPENSEARCH_DASHBOARDS_PASSWORD)"
users=config/opensearch-security/internal_users.yml
cat > "$users.tmp" <<YAML
# Written by deploy/elastic/opensearch-security.sh at start: the demo users are gone.
_meta:
  type: "internalusers"
  config_version: 2
admin:
  hash: "$admin_hash"
  reserved: true
  backend_roles: ["admin"]
  description: "jobtrace stack admin (OPENSEARCH_ADMIN_PASSWORD)"
kibanaserver:
  hash: "$dashboards_hash"
  reserved: true
  description: "OpenSearch Dashboards server user (OPENSEARCH_DASHBOARDS_PASSWORD)"
YAML
mv "$users.tmp" "$users"

export DISABLE_INSTALL_DEMO_CONFIG=true      # done above; the image's entry point must not run it again
exec ./opensearch-docker-entrypoint.sh "$@"
