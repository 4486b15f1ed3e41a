#!/usr/bin/env bash
# Builds the base image `debian:bookworm-slim` locally, from Debian's packages, for machines that
# reach a Debian mirror but no container registry (no Docker Hub). The Dockerfiles of docker/
# say `FROM debian:bookworm-slim` and build unchanged on top of it.
#
#   docker/build-base-image.sh            # builds it unless it exists (idempotent, ~0.1 s then)
#   FORCE=1 docker/build-base-image.sh    # rebuilds it
#
# How: `debootstrap --variant=minbase bookworm` into a temporary directory from the Debian
# mirror this machine's apt already uses (/etc/apt/sources.list and /etc/apt/sources.list.d/*;
# override with DEBIAN_MIRROR=http://...), the same trimming as the official slim image (no
# man pages, docs or locales; empty apt lists), then `podman import` and two tags:
#   localhost/debian:bookworm-slim           podman's name for a locally made image
#   docker.io/library/debian:bookworm-slim   the name `FROM debian:bookworm-slim` resolves to
# The image carries the label org.opencontainers.image.vendor=local-debootstrap so nobody takes
# it for Docker Hub's. Needs root, debootstrap and podman (apt-get installs what is missing).
#
# Environment: DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR (default: from apt's configuration),
# SUITE (default bookworm), FORCE=1, PODMAN (default podman).
set -euo pipefail

SUITE=${SUITE:-bookworm}
PODMAN=${PODMAN:-podman}
TAGS=("localhost/debian:${SUITE}-slim" "docker.io/library/debian:${SUITE}-slim")

log() { echo "build-base-image: $*" >&2; }

if [[ -z "${FORCE:-}" ]] && command -v "$PODMAN" >/dev/null 2>&1; then
  all=1
  for tag in "${TAGS[@]}"; do "$PODMAN" image exists "$tag" || all=0; done
  if ((all)); then
    log "${TAGS[1]} exists (FORCE=1 rebuilds it)"
    exit 0
  fi
fi

if [[ $(id -u) -ne 0 ]]; then
  log "debootstrap needs root"
  exit 1
fi

missing=()
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v "$PODMAN" >/dev/null 2>&1 || missing+=(podman runc)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The mirror that apt on this machine uses for $SUITE (and for $SUITE-security): one-line
# entries ("deb URI SUITE COMPONENTS") and deb822 stanzas (URIs:/Suites:) both count.
find_mirror() {
  local want=$1
  local files=()
  [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  ((${#files[@]})) || return 0
  awk -v want="$want" '
    function flush() {
      if (!done && uris != "" && types ~ /(^| )deb( |$)/) {
        n = split(suites, s, " ")
        for (i = 1; i <= n; i++) if (s[i] == want) { split(uris, u, " "); print u[1]; done = 1; exit }
      }
      uris = ""; suites = ""; types = ""
    }
    FNR == 1 { flush() }
    /^[[:space:]]*#/ { next }
    /^deb[[:space:]]/ {
      line = $0; sub(/\[[^]]*\]/, "", line); split(line, f, /[[:space:]]+/)
      if (f[3] == want && !done) { print f[2]; done = 1; exit }
      next
    }
    /^[[:space:]]*$/ { flush(); next }
    /^Types:/  { types = $0;  sub(/^Types:[[:space:]]*/, "", types) }
    /^URIs:/   { uris = $0;   sub(/^URIs:[[:space:]]*/, "", uris) }
    /^Suites:/ { suites = $0; sub(/^Suites:[[:space:]]*/, "", suites) }
    END { flush() }
  ' "${files[@]}" | head -n 1
}

mirror=${DEBIAN_MIRROR:-$(find_mirror "$SUITE")}
security=${DEBIAN_SECURITY_MIRROR:-$(find_mirror "$SUITE-security")}
if [[ -z "$mirror" ]]; then
  log "no Debian mirror for '$SUITE' in /etc/apt/sources.list*: set DEBIAN_MIRROR=http://..."
  exit 1
fi
log "mirror $mirror${security:+, security $security}"

work=$(mktemp -d /var/tmp/debian-rootfs.XXXXXX)
cleanup() {
  # debootstrap may leave /proc or /sys mounted in the target after a failure.
  for m in proc sys dev/pts dev; do umount -l "$work/rootfs/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
rootfs=$work/rootfs

start=$(date +%s)
log "debootstrap --variant=minbase $SUITE (a few minutes)"
debootstrap --variant=minbase --arch="$(dpkg --print-architecture)" \
  --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
  "$SUITE" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  log "debootstrap failed (full log above)"
  exit 1
}

# apt sources as in the official image (deb822), pointing at the mirror we used.
rm -f "$rootfs/etc/apt/sources.list"
{
  printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' "$mirror" "$SUITE" "$SUITE"
  printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  if [[ -n "$security" ]]; then
    printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' "$security" "$SUITE"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  fi
} >"$rootfs/etc/apt/sources.list.d/debian.sources"

# The trimming of the official slim image: no docs, man pages or translations from later
# installs; no recommends; apt caches cleaned after each install.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
cat >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends" <<'EOF'
APT::Install-Recommends "false";
EOF
# Nothing starts services inside a container build.
printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"

find "$rootfs/usr/share/doc" -mindepth 2 -not -name copyright -not -type d -delete 2>/dev/null || true
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
rm -rf "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/var/tmp/*
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/etc/hostname" "$rootfs/etc/resolv.conf"
for m in proc sys dev/pts dev; do umount -l "$rootfs/$m" 2>/dev/null || true; done

log "podman import"
version=$(cat "$rootfs/etc/debian_version")
tar --numeric-owner --xattrs --acls -C "$rootfs" -c . |
  "$PODMAN" import --quiet \
    --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change "LABEL org.opencontainers.image.vendor=local-debootstrap" \
    --change "LABEL org.opencontainers.image.description=debian:${SUITE}-slim built locally by docker/build-base-image.sh (debootstrap --variant=minbase from ${mirror})" \
    --change "LABEL org.opencontainers.image.version=${version}" \
    - "${TAGS[0]}" >/dev/null
"$PODMAN" tag "${TAGS[0]}" "${TAGS[1]}"
log "built ${TAGS[*]} (Debian $version) in $(($(date +%s) - start)) s:"
"$PODMAN" images --filter "reference=*debian:${SUITE}-slim" >&2
