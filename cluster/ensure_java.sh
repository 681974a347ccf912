#!/usr/bin/env bash
# ScienceWorld's simulator is a JVM: make sure a Java runtime (>= 8) is on PATH. Where none is,
# install Debian's headless one (needs root or sudo); elsewhere install a JRE yourself.
set -euo pipefail
if command -v java > /dev/null; then
    exit 0
fi
if ! command -v apt-get > /dev/null; then
    echo "ensure_java: no java on PATH and no apt-get: install a Java runtime >= 8 for ScienceWorld" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
fi
$sudo apt-get update -qq && $sudo apt-get install -y -qq default-jre-headless > /dev/null
java -version 2>&1 | head -1
