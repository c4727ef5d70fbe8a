#!/usr/bin/env bash
# Installs the Debian packages trainguard builds with, and the Python virtual environment (.venv/) the
# Python bindings' tests run in; does nothing when they are all present.
# Idempotent and safe to run repeatedly: ./scripts/demo.sh and ./scripts/test.sh both call it.
# CUDA and NCCL are optional and are not installed here: the build uses them when it finds them.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  ccache                           # scripts/test.sh: the wheel test reuses the build's objects
  libabsl-dev                      # Status, Time, Mutex, containers
  libprotobuf-dev protobuf-compiler
  libxxhash-dev                    # record checksums
  libssl-dev                       # TcpStore's handshake (HMAC-SHA256 from libcrypto)
  libcurl4-openssl-dev             # EtcdStore (etcd's JSON gateway over HTTP)
  etcd-server                      # /usr/bin/etcd for EtcdStore's tests
  nftables                         # /usr/sbin/nft: partitions between simulated hosts (tests)
  iproute2                         # /usr/sbin/tc: a slow link of one simulated host (bench_fail_slow)
  iptables                         # random loss on one simulated host's traffic (bench_fail_slow)
  liburing-dev                     # checkpoint persistence (io_uring)
  libgtest-dev libgmock-dev        # tests
  libbenchmark-dev                 # bench/
  libgloo-dev                      # CPU collectives of the example trainer
  python3-venv python3-dev         # the Python bindings (bindings/python) and their tests
  gnuplot-nox                      # `trainguard report --png`: the chaos run's progress plot
  gdb                              # tests: the stacks of a launcher test's ranks when a wait runs out
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python bindings' tools and test dependencies, from PyPI, in a virtual environment created
# once per machine and set of pins and reused by every clone: .venv is a link to
# ~/.cache/trainguard/venv-<pins> ($XDG_CACHE_HOME honoured), made under a lock, so a fresh clone
# does not unpack torch again. A .venv/ that is a folder (made by an older setup.sh) is used as it
# is, and so is $TG_VENV when set. Pinned: the torch tested here is
# 2.15.0; the bindings use only DLPack and public torch APIs and support torch >= 2.3 (DLPack
# max_version, torch.distributed.Store subclassing). PyPI's Linux torch is the CUDA build (about
# 5 GB installed); it runs on CPU. TG_SKIP_PYTHON=1 skips this part.
PY_PACKAGES=(
  torch==2.15.0
  numpy==2.4.6                     # 2.5 needs Python 3.12; Debian 12 has 3.11
  pytest==9.2.0
  nanobind==3.1.0
  scikit-build-core==1.1.2
)
if [ "${TG_SKIP_PYTHON:-0}" != 1 ]; then
  root="$(cd "$(dirname "$0")/.." && pwd)"
  if [ -n "${TG_VENV:-}" ]; then
    venv="$TG_VENV"
  elif [ -d "$root/.venv" ] && [ ! -L "$root/.venv" ]; then
    venv="$root/.venv"
  else
    pins="$(/usr/bin/python3 -c 'import sys; print(sys.version)'; printf '%s\n' "${PY_PACKAGES[@]}")"
    venv="${XDG_CACHE_HOME:-$HOME/.cache}/trainguard/venv-$(printf '%s' "$pins" | sha256sum | cut -c1-16)"
    ln -sfn "$venv" "$root/.venv"
  fi
  # One setup at a time makes or fills a shared environment (two clones' test runs at once).
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock -w 1800 9 || { echo "setup: waited 30 minutes for $venv.lock" >&2; exit 1; }
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating the Python virtual environment $venv"
    rm -rf "$venv"  # what an interrupted creation left
    /usr/bin/python3 -m venv "$venv"
  fi
  # Quick when done: one python start compares installed versions with the pins.
  if ! "$venv/bin/python" - "${PY_PACKAGES[@]}" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PYEOF
  then
    echo "setup: installing ${PY_PACKAGES[*]} into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  fi
fi
