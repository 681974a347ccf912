#!/usr/bin/env bash
# Unpack Debian's Prometheus server into .venv/prometheus/ (no service, no root install), for
# the observability e2e test and for watching a local run with cluster/prometheus.yml:
#   .venv/prometheus/usr/bin/prometheus --config.file=cluster/prometheus.yml \
#       --web.listen-address=127.0.0.1:9090 --storage.tsdb.path=runs/prometheus
# Elsewhere: install Prometheus >= 2.40 yourself and point PROMETHEUS_BIN at the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.venv/prometheus
if [ -x "$dest/usr/bin/prometheus" ]; then
    exit 0
fi
if ! command -v apt-get > /dev/null; then
    echo "fetch_prometheus: apt-get not found; install Prometheus >= 2.40 and set PROMETHEUS_BIN" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -qq prometheus 2> /dev/null)
mkdir -p "$dest"
dpkg -x "$tmp"/prometheus_*.deb "$dest"
"$dest/usr/bin/prometheus" --version | head -1
