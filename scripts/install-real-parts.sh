#!/usr/bin/env bash
# Install the real parts the tests start themselves (docs/architecture.md §12): Mosquitto, munge, Slurm 22.05,
# PostgreSQL, Prometheus, iptables, and kubectl (kustomize, for the Kubernetes overlays' test).
#
# Idempotent: does nothing when every binary is already there, and (re)creates only what is missing.
# The tests run their own mosquitto/slurmctld/slurmd on free loopback ports with private configs, so
# the system services the Debian packages would start (mosquitto on 1883, slurmctld, slurmd) are not
# used; a policy-rc.d keeps the packages from starting them during the install, and one that is
# running anyway does not matter. munged is shared: the tests reuse a running one or start it.
set -euo pipefail

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else echo "install-real-parts: need root" >&2; exit 1; fi
fi

have() { command -v "$1" >/dev/null 2>&1 || [[ -x /usr/sbin/$1 || -x /usr/bin/$1 ]]; }

missing=()
for bin in mosquitto mosquitto_passwd munged slurmctld slurmd scontrol sbatch; do
  have "$bin" || missing+=("$bin")
done
# PostgreSQL (the HA ledger's tests and `ftd bench failover`): the server tools are not on PATH.
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=("postgresql")
# Prometheus (promtool for the alert rules' tests; a real server for the alerting end-to-end test).
have promtool && have prometheus || missing+=("prometheus")
# iptables (the pair tests' lossy link: netfilter's statistic match drops a fraction of a namespace's
# packets; this kernel has no netem).
have iptables || missing+=("iptables")

if ((${#missing[@]})); then
  echo "install-real-parts: missing ${missing[*]}; installing packages"
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [[ ! -e $policy ]]; then
    # exit 101 = "action forbidden": packages do not start their services while we install.
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 0755 "$policy"
    created_policy=1
  fi
  cleanup() { if ((created_policy)); then $SUDO rm -f "$policy"; fi; }
  trap cleanup EXIT
  $SUDO apt-get update
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    mosquitto mosquitto-clients munge slurmctld slurmd slurm-client postgresql prometheus iptables
else
  echo "install-real-parts: mosquitto, munge, slurm, postgresql, prometheus and iptables are installed"
fi

# munge needs a shared key; the package usually creates one, a minimal image may not.
key=/etc/munge/munge.key
if ! $SUDO test -s "$key"; then
  echo "install-real-parts: creating $key"
  $SUDO mkdir -p /etc/munge
  if have mungekey; then
    $SUDO mungekey --create --keyfile="$key"
  elif have create-munge-key; then
    $SUDO create-munge-key -f
  else
    $SUDO dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
  fi
  $SUDO chown munge:munge "$key"
  $SUDO chmod 0400 "$key"
fi

# munged's socket directory is on tmpfs (/run): recreate it after a reboot.
$SUDO mkdir -p /run/munge
$SUDO chown munge:munge /run/munge

# --------------------------------------------------------------------------------------------------
# What the tests themselves run besides the real parts (under FTD_REQUIRE_REAL=1 none of them may be
# missing: a skip for it fails the run, tests/skips.py): Node.js for the dashboard's script tests
# (tests/unit/test_api_oncall.py, test_standby_api.py), strace to re-measure the agent unit's
# system-call filter (tests/unit/test_systemd_units.py).
tools=()
have node || tools+=(nodejs)
have strace || tools+=(strace)
# kubectl: its kustomize builds every documented overlay of deploy/kubernetes
# (tests/integration/test_k8s_kustomize.py); Debian's package is kubernetes-client.
have kubectl || tools+=(kubernetes-client)
if ((${#tools[@]})); then
  echo "install-real-parts: installing ${tools[*]}"
  $SUDO apt-get update
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${tools[@]}"
else
  echo "install-real-parts: node, strace and kubectl are installed"
fi

# --------------------------------------------------------------------------------------------------
# Headless Chromium for the dashboard test (tests/e2e/test_dashboard.py). Appended as its own block.
if ! have chromium; then
  echo "install-real-parts: installing chromium (dashboard test)"
  $SUDO apt-get update
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
else
  echo "install-real-parts: chromium is installed"
fi
