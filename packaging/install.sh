#!/usr/bin/env bash
# Install (or remove) the minisgl-chat launcher, icons and AppStream metainfo for the current
# user, following the XDG base directory layout:
#
#   $DATA/applications/minisgl-chat.desktop
#   $DATA/icons/hicolor/{48x48,128x128,256x256}/apps/minisgl-chat.png
#   $DATA/icons/hicolor/scalable/apps/minisgl-chat.svg
#   $DATA/metainfo/io.github.minisgl.Chat.metainfo.xml
#
# where DATA is --prefix DIR if given, else $XDG_DATA_HOME, else ~/.local/share.
# Running it again overwrites the same files; --uninstall removes exactly those files.
set -euo pipefail

APP=minisgl-chat
APP_ID=io.github.minisgl.Chat
ICON_SIZES=(48 128 256)

usage() {
    cat <<EOF
Usage: $(basename "$0") [--prefix DIR] [--uninstall]

Installs the $APP desktop launcher, icons and metainfo for the current user.

  --prefix DIR   data directory to install into (default: \$XDG_DATA_HOME or ~/.local/share)
  --uninstall    remove the files this script installs
  -h, --help     show this help
EOF
}

die() { echo "install.sh: error: $*" >&2; exit 1; }

prefix=""
uninstall=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --prefix)
            [[ $# -ge 2 && -n "$2" ]] || die "--prefix needs a directory"
            prefix="$2"; shift 2 ;;
        --prefix=*)
            prefix="${1#--prefix=}"; [[ -n "$prefix" ]] || die "--prefix needs a directory"
            shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

if [[ -n "$prefix" ]]; then
    data_dir="$prefix"
else
    data_dir="${XDG_DATA_HOME:-${HOME:?HOME is not set}/.local/share}"
fi
mkdir -p "$data_dir"
data_dir="$(cd "$data_dir" && pwd)"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
assets="$repo/assets"

desktop_dst="$data_dir/applications/$APP.desktop"
metainfo_dst="$data_dir/metainfo/$APP_ID.metainfo.xml"
svg_dst="$data_dir/icons/hicolor/scalable/apps/$APP.svg"
png_dst() { echo "$data_dir/icons/hicolor/${1}x${1}/apps/$APP.png"; }

refresh_caches() {
    if command -v update-desktop-database >/dev/null 2>&1 && [[ -d "$data_dir/applications" ]]; then
        update-desktop-database -q "$data_dir/applications" || true
        echo "ran update-desktop-database $data_dir/applications"
    fi
    if command -v gtk-update-icon-cache >/dev/null 2>&1 && [[ -d "$data_dir/icons/hicolor" ]]; then
        gtk-update-icon-cache -q -f -t "$data_dir/icons/hicolor" || true
        echo "ran gtk-update-icon-cache $data_dir/icons/hicolor"
    fi
}

if [[ $uninstall -eq 1 ]]; then
    removed=0
    targets=("$desktop_dst" "$metainfo_dst" "$svg_dst")
    for size in "${ICON_SIZES[@]}"; do targets+=("$(png_dst "$size")"); done
    for f in "${targets[@]}"; do
        if [[ -e "$f" || -L "$f" ]]; then
            rm -f -- "$f"
            echo "removed $f"
            removed=$((removed + 1))
        fi
    done
    [[ $removed -gt 0 ]] || echo "nothing to remove under $data_dir"
    refresh_caches
    exit 0
fi

# ---- install ------------------------------------------------------------------------------
for f in "$here/$APP.desktop" "$here/$APP_ID.metainfo.xml" "$assets/icon.svg"; do
    [[ -f "$f" ]] || die "missing source file $f"
done
for size in "${ICON_SIZES[@]}"; do
    [[ -f "$assets/icon-$size.png" ]] || die "missing source file $assets/icon-$size.png"
done

# The command the launcher runs: the minisgl-chat on PATH, else this checkout's virtualenv,
# else the bare name (the desktop environment then searches its own PATH).
exec_path=""
if found="$(command -v "$APP" 2>/dev/null)" && [[ "$found" == /* ]]; then
    exec_path="$found"
elif [[ -x "$repo/.venv/bin/$APP" ]]; then
    exec_path="$repo/.venv/bin/$APP"
fi

# Exec= quoting per the Desktop Entry spec: quote arguments with reserved characters, escape
# \ " ` $ inside the quotes, double % (field codes), then apply the string-level \ escape.
desktop_exec_arg() {
    local s="$1"
    s="${s//%/%%}"
    if [[ "$s" =~ ^[A-Za-z0-9_/.,+:@=%-]+$ ]]; then
        printf '%s' "$s"
        return
    fi
    s="${s//\\/\\\\}"
    s="${s//\"/\\\"}"
    s="${s//\`/\\\`}"
    s="${s//\$/\\\$}"
    s="${s//\\/\\\\}"          # string-level escape of every backslash
    printf '"%s"' "$s"
}
desktop_string() { local s="${1//\\/\\\\}"; printf '%s' "$s"; }

mkdir -p "$data_dir/applications"
tmp="$(mktemp "$data_dir/applications/.$APP.desktop.XXXXXX")"
trap 'rm -f -- "$tmp"' EXIT
if [[ -n "$exec_path" ]]; then
    exec_line="Exec=$(desktop_exec_arg "$exec_path")"
    tryexec_line="TryExec=$(desktop_string "$exec_path")"
    while IFS= read -r line || [[ -n "$line" ]]; do
        case "$line" in
            Exec=*) printf '%s\n' "$exec_line" ;;
            TryExec=*) printf '%s\n' "$tryexec_line" ;;
            *) printf '%s\n' "$line" ;;
        esac
    done <"$here/$APP.desktop" >"$tmp"
else
    cp -- "$here/$APP.desktop" "$tmp"
fi
chmod 0644 "$tmp"
mv -f -- "$tmp" "$desktop_dst"
trap - EXIT
echo "installed $desktop_dst ($(grep -m1 '^Exec=' "$desktop_dst"))"
if [[ -z "$exec_path" ]]; then
    echo "note: $APP was not found on PATH nor in $repo/.venv; the launcher runs plain '$APP'"
fi

install -D -m 0644 "$assets/icon.svg" "$svg_dst"
echo "installed $svg_dst"
for size in "${ICON_SIZES[@]}"; do
    install -D -m 0644 "$assets/icon-$size.png" "$(png_dst "$size")"
    echo "installed $(png_dst "$size")"
done
install -D -m 0644 "$here/$APP_ID.metainfo.xml" "$metainfo_dst"
echo "installed $metainfo_dst"

refresh_caches
echo "done: $APP is in the application menu (log out and in if it does not show yet)"
