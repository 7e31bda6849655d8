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

# write_man_pages BINARY DIR: the man pages of BINARY (`oobfence man`: oobfence.1, one page per
# command, oobfence.toml.5), gzipped as Debian and RPM want them (-9n: no name or time stamp),
# into DIR, replacing what was there.
write_man_pages() {
    local bin="$1" dir="$2"
    rm -rf "$dir"
    "$bin" man --output "$dir" || die "$bin man --output $dir failed"
    gzip -9n "$dir"/*.1 "$dir"/*.5
}

# write_completions BINARY DIR: DIR/oobfence.bash, DIR/_oobfence (zsh), DIR/oobfence.fish.
write_completions() {
    local bin="$1" dir="$2"
    rm -rf "$dir"
    mkdir -p "$dir"
    "$bin" completions bash >"$dir/oobfence.bash" || die "$bin completions bash failed"
    "$bin" completions zsh >"$dir/_oobfence" || die "$bin completions zsh failed"
    "$bin" completions fish >"$dir/oobfence.fish" || die "$bin completions fish failed"
}

# The newest glibc the RPM and the tarball may need: RHEL, Rocky and Alma 9 have 2.34.
OOBFENCE_MAX_GLIBC=2.34

# glibc_needed BINARY: the highest GLIBC_x.y symbol version BINARY needs ("" when none: a
# static binary).
glibc_needed() {
    objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -Vu | tail -n 1
}

# check_glibc BINARY [MAX]: fail unless BINARY runs with glibc MAX (default OOBFENCE_MAX_GLIBC).
check_glibc() {
    local bin="$1" max="${2:-$OOBFENCE_MAX_GLIBC}" needed
    command -v objdump >/dev/null || die "objdump not found (Debian: binutils)"
    needed="$(glibc_needed "$bin")"
    if [ -n "$needed" ] && [ "$(printf '%s\n%s\n' "$needed" "$max" | sort -V | tail -n 1)" != "$max" ]; then
        printf 'error: %s needs glibc %s, newer than %s: it would not start on RHEL 9. Build on an older distribution (glibc <= %s)\n' \
            "$bin" "$needed" "$max" "$max" >&2
        return 1
    fi
    log "$(basename "$bin") needs glibc ${needed:-none (static)}, at most $max"
}

# stage_tree BINARY MAN_DIR COMPLETIONS_DIR DEST ZSH_DIR: the files of the RPM and the tarball,
# at their paths on the installed system, under DEST (replaced). The binary is stripped.
# ZSH_DIR: where zsh looks for vendor completions (usr/share/zsh/site-functions on RHEL).
stage_tree() {
    local bin="$1" man="$2" comp="$3" dest="$4" zsh_dir="$5" top
    top="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    rm -rf "$dest"
    install -d -m 0755 "$dest/usr/bin" "$dest/usr/lib/systemd/system" "$dest/usr/lib/sysusers.d" \
        "$dest/usr/lib/tmpfiles.d" "$dest/etc/oobfence" "$dest/usr/share/doc/oobfence/examples" \
        "$dest/usr/share/man/man1" "$dest/usr/share/man/man5" \
        "$dest/usr/share/bash-completion/completions" "$dest/$zsh_dir" \
        "$dest/usr/share/fish/vendor_completions.d"
    install -m 0755 "$bin" "$dest/usr/bin/oobfence"
    strip --strip-unneeded "$dest/usr/bin/oobfence"
    install -m 0644 "$top/systemd/oobfence@.service" "$dest/usr/lib/systemd/system/"
    install -m 0644 "$top/packaging/sysusers.conf" "$dest/usr/lib/sysusers.d/oobfence.conf"
    install -m 0644 "$top/packaging/tmpfiles.conf" "$dest/usr/lib/tmpfiles.d/oobfence.conf"
    install -m 0644 "$top/packaging/example.toml" "$dest/etc/oobfence/example.toml"
    install -d -m 0755 "$dest/etc/logrotate.d"
    install -m 0644 "$top/packaging/logrotate" "$dest/etc/logrotate.d/oobfence"
    # The operators' pages, flat beside the README (the alerts link to .../runbook.md), and the
    # pictures they show.
    install -m 0644 "$top/README.md" "$top/CHANGELOG.md" "$top/LICENSE" "$top/docs/runbook.md" "$top/docs/install.md" \
        "$top/docs/power-sources.md" "$top/docs/decisions.md" "$top/docs/configuration.md" \
        "$top/docs/benchmarks.md" "$dest/usr/share/doc/oobfence/"
    install -d -m 0755 "$dest/usr/share/doc/oobfence/pictures"
    install -m 0644 "$top"/docs/pictures/*.svg "$dest/usr/share/doc/oobfence/pictures/"
    install -m 0644 "$top/config/example-dc.toml" "$top/deploy/rbac.yaml" \
        "$top/deploy/prometheus/oobfence-rules.yaml" "$top/deploy/prometheus/alertmanager-example.yaml" \
        "$top/deploy/grafana/oobfence-dashboard.json" "$dest/usr/share/doc/oobfence/examples/"
    install -m 0644 "$man"/*.1.gz "$dest/usr/share/man/man1/"
    install -m 0644 "$man"/*.5.gz "$dest/usr/share/man/man5/"
    install -m 0644 "$comp/oobfence.bash" "$dest/usr/share/bash-completion/completions/oobfence"
    install -m 0644 "$comp/_oobfence" "$dest/$zsh_dir/_oobfence"
    install -m 0644 "$comp/oobfence.fish" "$dest/usr/share/fish/vendor_completions.d/oobfence.fish"
}

# crate_version: the version in Cargo.toml.
crate_version() {
    local top
    top="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    sed -n 's/^version = "\(.*\)"/\1/p' "$top/Cargo.toml" | head -n 1
}

# cargo_target_dir: where cargo puts what it builds ($CARGO_TARGET_DIR or target/).
cargo_target_dir() {
    cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'
}

# The cargo-deb that builds the .deb: pinned, kept under $OOBFENCE_CACHE.
OOBFENCE_CARGO_DEB_VERSION=3.8.0
OOBFENCE_CARGO_DEB="$OOBFENCE_CACHE/cargo-deb/bin/cargo-deb"

# ensure_cargo_deb: install cargo-deb OOBFENCE_CARGO_DEB_VERSION unless it is there (about 3
# minutes on 2 cores, once).
ensure_cargo_deb() {
    if [ "$("$OOBFENCE_CARGO_DEB" --version 2>/dev/null)" != "cargo-deb $OOBFENCE_CARGO_DEB_VERSION" ]; then
        log "cargo install cargo-deb $OOBFENCE_CARGO_DEB_VERSION into $OOBFENCE_CACHE/cargo-deb"
        cargo install --quiet --locked --force --version "$OOBFENCE_CARGO_DEB_VERSION" \
            --root "$OOBFENCE_CACHE/cargo-deb" cargo-deb
        [ "$("$OOBFENCE_CARGO_DEB" --version 2>/dev/null)" = "cargo-deb $OOBFENCE_CARGO_DEB_VERSION" ] \
            || die "cargo install cargo-deb did not leave a working $OOBFENCE_CARGO_DEB"
    fi
}
