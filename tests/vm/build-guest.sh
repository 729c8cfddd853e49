#!/usr/bin/env bash
# Assembles the end-to-end tests' virtual machine guest from Debian packages only:
# the kernel of linux-image-cloud-amd64 and an initramfs of busybox-static, the
# virtio-net driver modules of that same kernel (dependencies first) and this
# directory's init and udhcpc script. Prints the directory holding `vmlinuz` and
# `initrd.img` on its last line.
#
# The packages are downloaded with `apt-get download` (never installed) and the
# result is cached in OVERLAY_TEST_VM_CACHE (default /var/cache/overlay-test-vm),
# keyed by the packages' versions and this directory's files: a second run with
# nothing changed only computes the key. Concurrent runs take a lock. Needs apt,
# dpkg-deb, gzip and flock, all on any Debian machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${OVERLAY_TEST_VM_CACHE:-/var/cache/overlay-test-vm}"

# The modules virtio-net needs; their dependencies are found from the modules'
# own metadata and loaded first. Built-in ones are skipped.
wanted_modules=(virtio_pci virtio_net)

die() { echo "build-guest: $*" >&2; exit 1; }

# The candidate version apt would download for package $1.
candidate() {
    local v
    v="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    [ -n "$v" ] && [ "$v" != "(none)" ] || return 1
    echo "$v"
}

# The concrete kernel image package behind the metapackage, and the versions.
resolve() {
    kernel_pkg="$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
    [ -n "$kernel_pkg" ] || return 1
    kernel_ver="$(candidate "$kernel_pkg")" || return 1
    busybox_ver="$(candidate busybox-static)" || return 1
}

command -v apt-get >/dev/null || die "apt-get not found: the guest is built from Debian packages"
if ! resolve; then
    # A machine whose package lists were never fetched.
    apt-get update -qq || die "apt-get update failed"
    resolve || die "apt cannot resolve linux-image-cloud-amd64 and busybox-static"
fi

key="$( {
    echo "$kernel_pkg=$kernel_ver busybox-static=$busybox_ver"
    cat "$here/build-guest.sh" "$here/init" "$here/udhcpc.script"
} | sha256sum | cut -c1-16)"
out="$cache/guest-$key"

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# Images of other versions (older packages, earlier init scripts) unused for a
# week go; the one in use is marked used now.
prune() {
    touch "$out"
    find "$cache" -mindepth 1 -maxdepth 1 -name 'guest-*' -mtime +7 ! -path "$out" \
        -exec rm -rf {} +
}

if [ -f "$out/initrd.img" ] && [ -f "$out/vmlinuz" ]; then
    prune
    echo "$out"
    exit 0
fi

work="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "build-guest: downloading $kernel_pkg=$kernel_ver busybox-static=$busybox_ver" >&2
# apt-get download runs as the _apt user where it can: let it write here.
chmod 0777 "$work"
apt-get download -q "$kernel_pkg=$kernel_ver" "busybox-static=$busybox_ver" >&2 ||
    die "apt-get download $kernel_pkg=$kernel_ver busybox-static=$busybox_ver failed"
dpkg-deb -x "$kernel_pkg"_*.deb kernel
dpkg-deb -x busybox-static_*.deb busybox
bb="$work/busybox/bin/busybox"
[ -x "$bb" ] || die "busybox-static has no bin/busybox"
vmlinuz="$(ls kernel/boot/vmlinuz-*)"
release="${vmlinuz##*/vmlinuz-}"
moddir="kernel/lib/modules/$release"
[ -d "$moddir" ] || die "no modules for kernel $release in $kernel_pkg"

# The initramfs tree.
root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules}
cp "$bb" "$root/bin/busybox"
for applet in $("$bb" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
cp "$here/init" "$root/init"
cp "$here/udhcpc.script" "$root/udhcpc.script"
chmod 0755 "$root/init" "$root/udhcpc.script"

# Modules in load order: each after its dependencies (its modinfo "depends").
: >"$root/modules.load"
declare -A done_modules=()
load() {
    local name="$1" file file_name deps dep
    [ -z "${done_modules[$name]:-}" ] || return 0
    done_modules[$name]=1
    # Module names use "_" where file names may use "-".
    file_name="${name//_/[-_]}"
    if grep -q "/$file_name\.ko\$" "$moddir/modules.builtin"; then
        echo "build-guest: $name is built into $release" >&2
        return 0
    fi
    file="$(find "$moddir" -name "$file_name.ko*" | head -n 1)"
    [ -n "$file" ] || die "module $name is neither built into $release nor shipped with it"
    case "$file" in
    *.ko) ;;
    *.ko.xz) xz -d "$file"; file="${file%.xz}" ;;
    *.ko.zst) zstd -q -d --rm "$file"; file="${file%.zst}" ;;
    *) die "module file $file: unknown compression" ;;
    esac
    # The .modinfo section's NUL-terminated "depends=a,b" string.
    deps="$(tr '\0' '\n' <"$file" | sed -n 's/^depends=//p' | head -n 1)"
    for dep in ${deps//,/ }; do
        load "$dep"
    done
    cp "$file" "$root/lib/modules/$name.ko"
    echo "$name.ko" >>"$root/modules.load"
}
for m in "${wanted_modules[@]}"; do
    load "$m"
done
echo "build-guest: modules $(tr '\n' ' ' <"$root/modules.load")" >&2

(cd "$root" && find . | LC_ALL=C sort | "$bb" cpio -o -H newc -R 0:0 2>/dev/null) |
    gzip -9 >initrd.img
mkdir -p "$out.new"
mv initrd.img "$out.new/initrd.img"
cp "$vmlinuz" "$out.new/vmlinuz"
echo "$kernel_pkg=$kernel_ver busybox-static=$busybox_ver kernel=$release" >"$out.new/versions"
rm -rf "$out"
mv "$out.new" "$out"
prune
echo "$out"
