#!/usr/bin/env bash
# Builds the local stand-ins for the official base images, for an engine that reaches no image registry:
#
#   pocserve-local/python:3.11    for python:3.11-slim-bookworm   (frontend and CPU backend images)
#   pocserve-local/haproxy:2.6    for haproxy:2.6-alpine          (the load balancer)
#
# Both come from one Debian bookworm root file system made by debootstrap from the package mirror (Python 3.11.2
# and HAProxy 2.6.12 are Debian's own packages: the same Python minor as the official image, the same HAProxy
# branch). Python gets a virtualenv at /usr/local/pocserve-python first on PATH, so `python` and `pip` behave as in
# the official image (Debian's own python3 refuses pip installs: PEP 668). An image that exists already is kept
# (the warm run builds nothing here); POCSERVE_REBUILD_BASES=1 rebuilds both.
#
# Needs root (debootstrap, chroot) and a running engine; scripts/compose_test.sh calls it.
set -euo pipefail

mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
python_image=pocserve-local/python:3.11
haproxy_image=pocserve-local/haproxy:2.6
docker=${DOCKER:-docker}

if [ "${POCSERVE_REBUILD_BASES:-0}" != 1 ] \
   && $docker image inspect "$python_image" >/dev/null 2>&1 \
   && $docker image inspect "$haproxy_image" >/dev/null 2>&1; then
    echo "compose_bases: $python_image and $haproxy_image exist (POCSERVE_REBUILD_BASES=1 rebuilds them)"
    exit 0
fi

command -v debootstrap >/dev/null || { echo "compose_bases: debootstrap is not installed" >&2; exit 1; }
rootfs=$(mktemp -d /var/tmp/pocserve-rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$rootfs"' EXIT
# mktemp makes it 0700, and tar takes "." as the image's /: the containers' non-root users could not reach a file.
chmod 755 "$rootfs"

echo "compose_bases: debootstrap $suite from $mirror into $rootfs"
# minbase: apt, dpkg and the required packages only; passwd (useradd) is among them, as in the official image.
debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates,haproxy,wget \
    "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; echo "compose_bases: debootstrap failed (log: $rootfs.log)" >&2; exit 1; }
rm -f "$rootfs.log"

# The host's trust anchors: where a TLS-intercepting proxy sits between this machine and the package index, pip in
# the image builds trusts what the host trusts (Debian's bundle would refuse the proxy's certificate).
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
venv=/usr/local/pocserve-python
chroot "$rootfs" /usr/bin/python3 -m venv "$venv"
chroot "$rootfs" /bin/sh -ec "apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log"
# The official haproxy image reads /usr/local/etc/haproxy/haproxy.cfg; compose mounts the project's config there.
mkdir -p "$rootfs/usr/local/etc/haproxy"

path="$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# LANG as in the official python image (UTF-8 file names and stdio).
tar -C "$rootfs" --one-file-system -c . | $docker import \
    --change "ENV PATH=$path" --change "ENV LANG=C.UTF-8" \
    --change "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt" --change 'CMD ["python3"]' \
    - "$python_image" >/dev/null
tar -C "$rootfs" --one-file-system -c . | $docker import \
    --change "ENV LANG=C.UTF-8" \
    --change 'CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]' \
    - "$haproxy_image" >/dev/null
$docker run --rm --user 10001:10001 "$python_image" python -c "import sys, ssl, venv; print('compose_bases: python', \
sys.version.split()[0])"  # as the images' unprivileged user: a root-only / fails here, not at compose up
$docker run --rm "$haproxy_image" haproxy -v | sed -n "1s/^/compose_bases: /p"
