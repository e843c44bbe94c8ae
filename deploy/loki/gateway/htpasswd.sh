#!/bin/sh
# Writes the Loki gateway's htpasswd file from LOKI_USER (default jobtrace) and LOKI_PASSWORD
# (required, at least 12 characters), bcrypt-hashed. Run by the one-shot `gateway-auth` service of
# deploy/loki/compose.yaml at every `up`, so a changed password takes effect on the next start.
#
#   LOKI_PASSWORD=... sh htpasswd.sh [OUTPUT]        # OUTPUT defaults to /auth/htpasswd
set -eu
: "${LOKI_PASSWORD:?set LOKI_PASSWORD (the Loki gateway has no default password)}"
user="${LOKI_USER:-jobtrace}"
out="${1:-/auth/htpasswd}"
if [ "${#LOKI_PASSWORD}" -lt 12 ]; then
  echo "htpasswd.sh: LOKI_PASSWORD is too short: use at least 12 characters" >&2
  exit 1
fi
case "$user" in
  *:*|"") echo "htpasswd.sh: LOKI_USER must be non-empty and contain no ':'" >&2; exit 1 ;;
esac
umask 022                           # nginx's worker (another user) reads it; it holds a hash only
# -i: the password from stdin, never on a command line; -B: bcrypt.
printf '%s\n' "$LOKI_PASSWORD" | htpasswd -niB -C 10 "$user" | grep -v '^$' > "$out.tmp"
mv "$out.tmp" "$out"
echo "htpasswd.sh: wrote $out for user $user"
