#!/usr/bin/env bash
# Make sure Go, Java 17 and Maven are there, then build (or find cached) the test servers.
#
# Called by .ci/run before pytest; idempotent, about a second when everything is cached.
# Installs from Debian apt only what is missing. Debian 12 ships Go 1.19, too old for
# VictoriaLogs (go 1.26.5), so in that case the current Go toolchain is fetched as the
# Go module golang.org/toolchain (what GOTOOLCHAIN=auto does) into the server cache.
#
# Env: JOBTRACE_SERVERS_CACHE (default ~/.cache/jobtrace-servers), PYTHON (default
# .venv/bin/python, else python3).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${JOBTRACE_SERVERS_CACHE:-$HOME/.cache/jobtrace-servers}
GO_BOOTSTRAP=go1.26.8   # used only when no Go >= 1.21 is installed
mkdir -p "$CACHE"
export PATH="/usr/local/go/bin:$PATH"

now_ms() { date +%s%3N; }
T_ALL=$(now_ms)
step() { STEP=$1; T0=$(now_ms); }
done_step() { echo "[install-toolchains] $STEP: $1 ($(( $(now_ms) - T0 )) ms)"; }

APT_UPDATED=0
apt_install() {
  if [ "$APT_UPDATED" = 0 ]; then apt-get update -qq; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# minor version of a Go binary (1.26.8 -> 26), 0 if unusable
go_minor() { "$1" env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p' | grep . || echo 0; }

step "go"
if [ -x "$CACHE/go/bin/go" ]; then
  GO="$CACHE/go/bin/go"; done_step "bootstrapped $("$GO" env GOVERSION) in cache"
elif command -v go >/dev/null && [ "$(go_minor go)" -ge 21 ]; then
  GO=$(command -v go); done_step "$("$GO" env GOVERSION) at $GO (newer toolchains via GOTOOLCHAIN=auto)"
else
  command -v go >/dev/null || apt_install golang-go ca-certificates
  arch=$(uname -m); case "$arch" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; esac
  tmp=$(mktemp -d)
  dir=$(cd "$tmp" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json \
          "golang.org/toolchain@v0.0.1-$GO_BOOTSTRAP.linux-$arch" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  rm -rf "$CACHE/go.tmp" && cp -r "$dir" "$CACHE/go.tmp"
  chmod -R u+w "$CACHE/go.tmp" && chmod +x "$CACHE/go.tmp"/bin/* "$CACHE/go.tmp"/pkg/tool/*/*
  mv "$CACHE/go.tmp" "$CACHE/go"; rm -rf "$tmp"
  GO="$CACHE/go/bin/go"; done_step "bootstrapped $("$GO" env GOVERSION) from the module proxy"
fi
export JOBTRACE_GO="$GO"

step "java"
java_major() { "$1" -version 2>&1 | sed -n '1s/.*version "\([0-9]*\).*/\1/p'; }
if command -v java >/dev/null && [ "$(java_major java)" = 17 ]; then
  done_step "java 17 at $(command -v java)"
else
  j17=$(ls -d /usr/lib/jvm/java-17-openjdk-*/bin/java 2>/dev/null | head -1 || true)
  if [ -z "$j17" ]; then apt_install openjdk-17-jdk-headless; j17=$(ls -d /usr/lib/jvm/java-17-openjdk-*/bin/java | head -1); fi
  export JAVA_HOME=$(dirname "$(dirname "$j17")") JOBTRACE_JAVA="$j17"
  done_step "java 17 at $j17 (JAVA_HOME=$JAVA_HOME)"
fi

step "maven"
command -v mvn >/dev/null || apt_install maven
done_step "$(mvn -v 2>/dev/null | sed -n '1s/\x1b\[[0-9;]*m//g;1p')"

PY=${PYTHON:-}
[ -n "$PY" ] || { [ -x "$REPO/.venv/bin/python" ] && PY="$REPO/.venv/bin/python"; } || PY=python3
for server in victorialogs opensearch jaeger vmalert victoriametrics seaweedfs prometheus3; do
  step "build $server"
  (cd "$REPO" && "$PY" -m tests.servers build "$server")
  done_step "ok"
done
echo "[install-toolchains] total $(( $(now_ms) - T_ALL )) ms; cache $CACHE"
