#!/usr/bin/env bash
# Generates certificates for collectived's mutual TLS into DIR (created if needed), with openssl:
#
#   ca.crt, ca.key                  a CA (the --tls-ca of sidecars and clients)
#   sidecar.crt, sidecar.key        a sidecar: CN collectived, SAN DNS:collectived,
#                                   DNS:localhost, IP:127.0.0.1; serverAuth and clientAuth
#                                   (--tls-cert/--tls-key; sidecars call each other with it)
#   admin.crt, admin.key            an operator: CN and SAN DNS:collectived-admin; clientAuth
#   client.crt, client.key          a plain remote client: CN and SAN DNS:collectived-client
#   rogue-ca.crt, rogue-ca.key      a second, unrelated CA
#   rogue-sidecar.crt/.key          a sidecar-looking certificate signed by the rogue CA
#
# EC P-256 keys (fast), valid for DAYS (default 365). For tests and the demo; in production use
# your own PKI (see the README and k8s/, e.g. cert-manager).
#
# Usage: scripts/gen-certs.sh DIR [CA_NAME]   (CA_NAME: the CA's common name, default
#        "collectived test CA"; give another to make a distinct CA, e.g. for rotation tests)
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
command -v openssl >/dev/null || { echo "gen-certs: openssl not found (apt-get install openssl)" >&2; exit 1; }
DIR=$1
CA_NAME=${2:-collectived test CA}
DAYS=${DAYS:-365}
mkdir -p "$DIR"
cd "$DIR"
umask 077

# new_key NAME: a P-256 private key in NAME.key (PKCS#8 PEM).
new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

# new_ca NAME CN
new_ca() {
  new_key "$1"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days "$DAYS" -sha256 -out "$1.crt" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

# new_leaf NAME CA CN SAN EKU
new_leaf() {
  new_key "$1"
  openssl req -new -key "$1.key" -subj "/CN=$3" -out "$1.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=$5" "subjectAltName=$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -set_serial "0x$(openssl rand -hex 16)" \
    -days "$DAYS" -sha256 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

new_ca ca "$CA_NAME"
new_leaf sidecar ca collectived "DNS:collectived,DNS:localhost,IP:127.0.0.1" "serverAuth,clientAuth"
new_leaf admin ca collectived-admin "DNS:collectived-admin" "clientAuth"
new_leaf client ca collectived-client "DNS:collectived-client" "clientAuth"
new_ca rogue-ca "collectived rogue CA"
new_leaf rogue-sidecar rogue-ca collectived "DNS:collectived,DNS:localhost,IP:127.0.0.1" \
  "serverAuth,clientAuth"
chmod 0644 ./*.crt
chmod 0600 ./*.key
echo "gen-certs: wrote ca, sidecar, admin, client, rogue-ca and rogue-sidecar certificates to $PWD"
