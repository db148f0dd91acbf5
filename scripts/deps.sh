#!/usr/bin/env bash
# Installs the Debian packages ctitan needs, only those that are missing (a fast no-op otherwise).
set -euo pipefail
pkgs=(build-essential pkg-config libyaml-dev libopenblas-openmp-dev libpcre2-dev libjansson-dev
      zlib1g-dev libzstd-dev libcmocka-dev libtomlplusplus-dev libopenmpi-dev openmpi-bin fortunes-min fortunes procps
      libcairo2-dev libfontconfig-dev fonts-dejavu-core)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
