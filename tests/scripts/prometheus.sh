#!/usr/bin/env bash
# Installs Debian's prometheus package when missing and prints the paths of its two programs,
# promtool then prometheus, one a line. It starts nothing: tests/integration/
# test_prometheus_rules.py checks etc/prometheus/gmd-rules.yml with promtool and starts a
# Prometheus of its own on a free port. apt-get update only if the install fails without it.
# The package's maintainer scripts may start its service (on :9090, which the tests do not use);
# a service started by this install is stopped (and, under systemd, disabled) again.
set -euo pipefail
cd "$(dirname "$0")/../.."

STATE="$(pwd)/var/prometheus"

die() {
    echo "gmd prometheus: $*" >&2
    exit 1
}

found() { command -v promtool >/dev/null && command -v prometheus >/dev/null; }

if ! found; then
    command -v apt-get >/dev/null ||
        die "Prometheus is not installed and there is no apt-get here: install promtool and prometheus (2.x) by hand"
    [ "$(id -u)" -eq 0 ] ||
        die "Prometheus is not installed: run as root, or: sudo apt-get install --no-install-recommends prometheus"
    mkdir -p "$STATE"
    echo "gmd prometheus: installing Debian's prometheus package" >&2
    install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
    }
    { install || { apt-get update -qq && install; }; } >>"$STATE/apt.log" 2>&1 ||
        die "could not install prometheus; see $STATE/apt.log"
    # Where an init system runs, the package started its service: the tests need none.
    if [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus.service >>"$STATE/apt.log" 2>&1 || true
    elif [ -x /etc/init.d/prometheus ]; then
        /etc/init.d/prometheus stop >>"$STATE/apt.log" 2>&1 || true
    fi
    found || die "prometheus is installed but promtool or prometheus is not on PATH; see $STATE/apt.log"
fi
command -v promtool
command -v prometheus
