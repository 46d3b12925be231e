#!/bin/sh
# Certificates for the peer channel's tests and benchmark (docs/PEERS.md "Certificates"), made with
# the openssl command: P-256 keys, each node's subject CN and DNS subjectAltName its node id.
#   peer_certs.sh ca DIR NAME                 -> DIR/NAME.pem, DIR/NAME.key (a self-signed CA)
#   peer_certs.sh node DIR CA NODE [DAYS]     -> DIR/NODE.pem, DIR/NODE.key signed by DIR/CA.*;
#                                                DAYS 0 makes a certificate already expired
set -eu
kind=$1
dir=$2
mkdir -p "$dir"
case "$kind" in
ca)
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -keyout "$dir/$3.key" -out "$dir/$3.pem" -subj "/CN=$3" 2>/dev/null
  ;;
node)
  ca=$3
  node=$4
  days=${5:-30}
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/$node.key" -out "$dir/$node.csr" -subj "/CN=$node" 2>/dev/null
  printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$node" \
    > "$dir/$node.ext"
  openssl x509 -req -in "$dir/$node.csr" -CA "$dir/$ca.pem" -CAkey "$dir/$ca.key" \
    -CAcreateserial -days "$days" -extfile "$dir/$node.ext" -out "$dir/$node.pem" 2>/dev/null
  rm -f "$dir/$node.csr" "$dir/$node.ext"
  ;;
*)
  echo "usage: $0 ca DIR NAME | node DIR CA NODE [DAYS]" >&2
  exit 2
  ;;
esac
