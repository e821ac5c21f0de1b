#!/usr/bin/env bash
# Make a private CA and the certificates for ftd's mutual-TLS bus (deploy/mosquitto, [bus] cert_file).
#
#   make-certs.sh [-d DIR] [-D DAYS] [-f] ca
#   make-certs.sh [-d DIR] [-D DAYS] server NAME [NAME|IP ...]
#   make-certs.sh [-d DIR] [-D DAYS] client NAME [NAME ...]
#
# ca      DIR/ca.crt and DIR/ca.key: the CA that signs everything below (refused if DIR/ca.key
#         exists, unless -f). Keep ca.key off the cluster; only ca.crt is distributed.
# server  DIR/server.crt and .key for the broker: CN = the first NAME; every NAME and IP address
#         given becomes a subjectAltName (clients check the host they connect to against them).
# client  DIR/NAME.crt and .key per NAME, CN = NAME: a node's certificate has CN = its node name
#         (the ACL's %u through use_identity_as_username), the coordinator's CN = coordinator,
#         an HA standby's read-only view (coordinator.ha.standby_cert_file) CN = coordinator-standby.
#
# -d DIR   where the files go (default: .); keys are created with mode 0600.
# -D DAYS  validity in days (default 825; a negative number makes an already expired certificate,
#          for tests).
# Keys are EC P-256. Needs openssl (1.1.1 or 3.x).
set -euo pipefail

dir=.
days=825
force=0
usage() { sed -n '4,6p' "$0" | sed 's/^# *//' >&2; exit 2; }
while getopts "d:D:fh" opt; do
  case $opt in
    d) dir=$OPTARG ;;
    D) days=$OPTARG ;;
    f) force=1 ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[[ $# -ge 1 ]] || usage
what=$1
shift
[[ $days =~ ^-?[0-9]+$ ]] || { echo "make-certs: -D wants a whole number of days, got '$days'" >&2; exit 2; }
command -v openssl >/dev/null || { echo "make-certs: openssl not found" >&2; exit 1; }
mkdir -p "$dir"

# Same rule as ftd.bus.topics.check_level and add-node.sh: a name is one topic level.
check_name() {
  if [[ ! $1 =~ ^[A-Za-z0-9._-]{1,128}$ ]]; then
    echo "make-certs: invalid name '$1' (letters, digits, '.', '_', '-')" >&2; exit 2
  fi
}

new_key() {  # new_key PATH: an EC P-256 private key only its owner can read
  (umask 077; openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null)
}

sign() {  # sign NAME CN EXTENSIONS: DIR/NAME.key + .crt signed by the CA, with those v3 extensions
  local name=$1 cn=$2 extensions=$3
  [[ -f $dir/ca.key && -f $dir/ca.crt ]] || { echo "make-certs: no CA in $dir (run: make-certs.sh -d $dir ca)" >&2; exit 1; }
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  new_key "$dir/$name.key"
  openssl req -new -key "$dir/$name.key" -subj "/CN=$cn" -out "$tmp/req.csr" 2>/dev/null
  printf '%s\n' "$extensions" >"$tmp/ext.cnf"
  openssl x509 -req -in "$tmp/req.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
    -extfile "$tmp/ext.cnf" -out "$dir/$name.crt" 2>/dev/null
  echo "make-certs: $dir/$name.crt (CN=$cn, $days days)"
}

case $what in
  ca)
    [[ $# -eq 0 ]] || usage
    if [[ -e $dir/ca.key && $force -eq 0 ]]; then
      echo "make-certs: $dir/ca.key exists; -f replaces it (every certificate it signed stops working)" >&2
      exit 1
    fi
    new_key "$dir/ca.key"
    openssl req -x509 -new -key "$dir/ca.key" -subj "/CN=ftd bus CA" -days "$days" -sha256 \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -out "$dir/ca.crt" 2>/dev/null
    echo "make-certs: $dir/ca.crt"
    ;;
  server)
    [[ $# -ge 1 ]] || usage
    alt=()
    for name in "$@"; do
      if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then
        alt+=("IP:$name")
      else
        check_name "$name"
        alt+=("DNS:$name")
      fi
    done
    sign server "$1" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$(IFS=,; echo "${alt[*]}")"
    ;;
  client)
    [[ $# -ge 1 ]] || usage
    for name in "$@"; do
      check_name "$name"
      [[ $name != ca && $name != server ]] || { echo "make-certs: '$name' would overwrite the $name files" >&2; exit 2; }
    done
    for name in "$@"; do
      sign "$name" "$name" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
    done
    ;;
  *) usage ;;
esac
