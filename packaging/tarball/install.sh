#!/bin/sh
# Installs oobfence from this tarball onto a host with systemd (RHEL/Rocky/Alma 9 and newer,
# any distribution with glibc 2.34 or later): the files under files/ go to the same paths as
# the .deb and the RPM put them, then the system user and /etc/oobfence are made, as the
# packages do.
#
# Usage: sudo ./install.sh [--root DIR]               install (DIR: another root, default /)
#        sudo ./install.sh [--root DIR] --uninstall   remove what install.sh installed
#
# An edited /etc/oobfence/example.toml or /etc/logrotate.d/oobfence is kept (the new one is
# written next to it, FILE.new); your own configs, secrets and the decision journal in /var/lib/oobfence
# are never touched. The list of installed files: /usr/share/doc/oobfence/installed-files.
set -eu

root=/
action=install
while [ $# -gt 0 ]; do
    case "$1" in
    --root) root="${2:?--root needs a directory}"; shift 2 ;;
    --uninstall) action=uninstall; shift ;;
    *) sed -n '2,13p' "$0" >&2; exit 2 ;;
    esac
done
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$root" && pwd)"
r="${root%/}"
manifest=/usr/share/doc/oobfence/installed-files
systemd_here() { [ "$root" = / ] && [ -d /run/systemd/system ]; }

if [ "$action" = uninstall ]; then
    [ -f "$r$manifest" ] || { echo "install.sh: $r$manifest not found: oobfence is not installed here by install.sh" >&2; exit 1; }
    if systemd_here; then
        units="$(systemctl list-units --no-legend --plain 'oobfence@*.service' 2>/dev/null | awk '{ print $1 }')"
        # shellcheck disable=SC2086 # one word per unit
        [ -z "$units" ] || systemctl stop $units || true
    fi
    for link in "$r"/etc/systemd/system/*.wants/oobfence@*.service; do
        [ -L "$link" ] && rm -f "$link"
    done
    while IFS= read -r f; do
        case "$f" in
        /etc/oobfence/example.toml | /etc/logrotate.d/oobfence)
            # Only the example as shipped; an edited one is the operator's.
            if cmp -s "$here/files$f" "$r$f"; then rm -f "$r$f"; fi ;;
        *) rm -f "$r$f" ;;
        esac
    done <"$r$manifest"
    rm -f "$r$manifest"
    rmdir "$r/usr/share/doc/oobfence/examples" "$r/usr/share/doc/oobfence/pictures" "$r/usr/share/doc/oobfence" 2>/dev/null || true
    if systemd_here; then systemctl --system daemon-reload || true; fi
    echo "oobfence removed; kept: /etc/oobfence (configs, secrets), the decision journal in /var/lib/oobfence, the user oobfence"
    exit 0
fi

[ -x "$here/files/usr/bin/oobfence" ] || { echo "install.sh: $here/files/usr/bin/oobfence missing: run it from the unpacked tarball" >&2; exit 1; }
if ! "$here/files/usr/bin/oobfence" --version >/dev/null 2>&1; then
    echo "install.sh: the binary does not run on this host (it needs glibc 2.34 or later): $("$here/files/usr/bin/oobfence" --version 2>&1 | head -n 1)" >&2
    exit 1
fi
for tool in systemd-sysusers systemd-tmpfiles; do
    command -v "$tool" >/dev/null || { echo "install.sh: $tool not found: oobfence needs systemd" >&2; exit 1; }
done

list="$(cd "$here/files" && find . -type f | sed 's#^\.##' | sort)"
echo "$list" | while IFS= read -r f; do
    src="$here/files$f"
    mode="$(stat -c %a "$src")"
    install -d -m 0755 "$r$(dirname "$f")"
    if case "$f" in /etc/*) true ;; *) false ;; esac && [ -e "$r$f" ] && ! cmp -s "$src" "$r$f"; then
        install -m "$mode" "$src" "$r$f.new"
        echo "install.sh: $f was edited: kept; the new one is $f.new"
        continue
    fi
    install -m "$mode" "$src" "$r$f"
done
printf '%s\n' "$list" >"$r$manifest"
chmod 0644 "$r$manifest"

# The user first: /etc/oobfence belongs to its group.
if [ "$root" = / ]; then
    systemd-sysusers oobfence.conf
    systemd-tmpfiles --create oobfence.conf
else
    systemd-sysusers --root="$root" oobfence.conf
    systemd-tmpfiles --root="$root" --create oobfence.conf
fi
if systemd_here; then
    systemctl --system daemon-reload
    units="$(systemctl list-units --no-legend --plain --state=active 'oobfence@*.service' 2>/dev/null | awk '{ print $1 }')"
    # An upgrade: the running daemons move to the new binary.
    # shellcheck disable=SC2086 # one word per unit
    [ -z "$units" ] || systemctl try-restart $units
fi
echo "oobfence $("$r/usr/bin/oobfence" --version 2>/dev/null | sed 's/^oobfence //') installed under $root"
echo "next: cp /etc/oobfence/example.toml /etc/oobfence/DC.toml, edit it, then systemctl enable --now oobfence@DC"
