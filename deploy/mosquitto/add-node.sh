#!/usr/bin/env bash
# Add (or change) a node's MQTT credentials in the ftd password file.
#
#   add-node.sh [-f PASSWD_FILE] [-p PASSWORD] [-r MOSQUITTO_PID_FILE] NODE
#
# The username is the node name (the ACL's %u). Without -p a random password is generated and
# printed once: give it to that node's agent (`[bus] username = NODE`, `password_file`, see
# ftd/config/schema.py). With -r the broker is sent SIGHUP to re-read the file; otherwise run
# `systemctl reload mosquitto`.
# The coordinator's own logins ("coordinator", and "coordinator-standby" for HA standbys, see the
# acl) are reserved: add them with mosquitto_passwd.
set -euo pipefail

passwd_file=/etc/mosquitto/ftd/passwd
password=""
pid_file=""
usage() { sed -n '4p' "$0" | sed 's/^# *//' >&2; exit 2; }
while getopts "f:p:r:h" opt; do
  case $opt in
    f) passwd_file=$OPTARG ;;
    p) password=$OPTARG ;;
    r) pid_file=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[[ $# -eq 1 ]] || usage
node=$1

# Same rule as ftd.bus.topics.check_level, and a node may not take the coordinator's name.
if [[ ! $node =~ ^[A-Za-z0-9._-]{1,128}$ ]]; then
  echo "add-node: invalid node name '$node' (letters, digits, '.', '_', '-')" >&2; exit 2
fi
if [[ $node == coordinator || $node == coordinator-standby ]]; then
  echo "add-node: '$node' is reserved for the coordinator's credentials" >&2; exit 2
fi
command -v mosquitto_passwd >/dev/null || { echo "add-node: mosquitto_passwd not found (package mosquitto)" >&2; exit 1; }

generated=0
if [[ -z $password ]]; then
  password=$(head -c 24 /dev/urandom | base64 | tr -d '/+=' | head -c 32)
  generated=1
fi

if [[ -e $passwd_file ]]; then
  mosquitto_passwd -b "$passwd_file" "$node" "$password"   # keeps the file's owner and mode
else
  mkdir -p "$(dirname "$passwd_file")"
  (umask 077; mosquitto_passwd -c -b "$passwd_file" "$node" "$password")
  # Mosquitto 2.0 reads the file after dropping root: let its group read it.
  if getent group mosquitto >/dev/null && [[ $(id -u) -eq 0 ]]; then
    chgrp mosquitto "$passwd_file"
    chmod 0640 "$passwd_file"
  fi
fi

if [[ -n $pid_file ]]; then
  kill -HUP "$(cat "$pid_file")"
  echo "add-node: $node added; broker (pid $(cat "$pid_file")) reloaded"
else
  echo "add-node: $node added to $passwd_file; run 'systemctl reload mosquitto' to apply"
fi
if ((generated)); then
  echo "password for $node: $password"
fi
