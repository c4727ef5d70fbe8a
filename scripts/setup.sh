#!/usr/bin/env bash
# Installs the Debian packages trainguard builds with; does nothing when they are all present.
# Idempotent and safe to run repeatedly: ./scripts/demo.sh and ./scripts/test.sh both call it.
# CUDA and NCCL are optional and are not installed here: the build uses them when it finds them.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev                      # Status, Time, Mutex, containers
  libprotobuf-dev protobuf-compiler
  libxxhash-dev                    # record checksums
  libssl-dev                       # TcpStore's handshake (HMAC-SHA256 from libcrypto)
  libcurl4-openssl-dev             # EtcdStore (etcd's JSON gateway over HTTP)
  etcd-server                      # /usr/bin/etcd for EtcdStore's tests
  nftables                         # /usr/sbin/nft: partitions between simulated hosts (tests)
  liburing-dev                     # checkpoint persistence (io_uring)
  libgtest-dev libgmock-dev        # tests
  libbenchmark-dev                 # bench/
  libgloo-dev                      # CPU collectives of the example trainer
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
