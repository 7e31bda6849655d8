# shellcheck shell=bash
# Shared helpers for the scripts in this directory. Source it, do not run it.

# Where downloaded and built artefacts are kept between runs.
OOBFENCE_CACHE="${OOBFENCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oobfence}"
export OOBFENCE_CACHE

log() {
    printf '==> %s\n' "$*" >&2
}

die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# Set to 1 once `apt-get update` has run in this process.
_OOBFENCE_APT_UPDATED="${_OOBFENCE_APT_UPDATED:-0}"

# Re-run `apt-get update` on the next apt_install (used after a source list changed).
apt_mark_stale() {
    _OOBFENCE_APT_UPDATED=0
}

# as_root CMD...: run CMD as root, through sudo when we are not root already.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo "$@"
    fi
}

# pkg_installed PKG: true when dpkg knows PKG as installed.
pkg_installed() {
    local status
    status="$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" || return 1
    [ "$status" = installed ]
}

# apt_install PKG...: install those of the given Debian packages that are missing.
apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        pkg_installed "$pkg" || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$_OOBFENCE_APT_UPDATED" != 1 ]; then
        log "apt-get update"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        _OOBFENCE_APT_UPDATED=1
        export _OOBFENCE_APT_UPDATED
    fi
    log "installing: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# write_man_pages BINARY DIR: the man pages of BINARY (`oobfence man`), gzipped as Debian wants
# them (-9n: no name or time stamp), into DIR, replacing what was there.
write_man_pages() {
    local bin="$1" dir="$2"
    rm -rf "$dir"
    "$bin" man --output "$dir" || die "$bin man --output $dir failed"
    gzip -9n "$dir"/*.1
}
