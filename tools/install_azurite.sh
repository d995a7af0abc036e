#!/usr/bin/env bash
# Install Azurite, Microsoft's Azure Storage emulator (a real Blob server process, from
# npm), into PREFIX for the az:// remote-repository test. Without it that test skips,
# saying why.
set -u
prefix=${1:-.tools/azurite}
mkdir -p "$prefix"
[ -x "$prefix/node_modules/.bin/azurite-blob" ] && exit 0
npm install --silent --no-audit --no-fund --no-save --prefix "$prefix" azurite@3 ||
  echo "azurite: npm could not install it; the az:// repository test will be skipped"
exit 0
