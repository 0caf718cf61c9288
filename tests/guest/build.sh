#!/usr/bin/env bash
# Build the small QEMU guest that runs the cgroup v2 tests (see harness.py): Debian's own kernel
# (fetched with apt-get download, never installed), its 9p/virtio, overlay, btrfs and loop modules,
# and a busybox initramfs whose /init is init.sh. Everything goes under build/guest/ (gitignored)
# and is reused while the kernel version and these scripts stay the same. Needs root, the Debian
# packages scripts/setup.sh installs (qemu-system-x86 busybox-static cpio kmod) and apt lists.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${HSG_DIR:-$(cd "$HERE/../.." && pwd)/build/guest}
MODULES=(9p 9pnet_virtio virtio_pci overlay btrfs loop)

# the kernel the linux-image-amd64 metapackage points at, e.g. linux-image-6.1.0-57-amd64
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
if [ -z "$pkg" ]; then
  apt-get update -qq
  pkg=$(apt-cache depends linux-image-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
fi
kver=${pkg#linux-image-}
stamp="$OUT/ready-$kver-$(cat "$HERE/build.sh" "$HERE/init.sh" | sha1sum | cut -c1-12)"
[ -e "$stamp" ] && exit 0
echo "guest: building the QEMU guest for the cgroup v2 tests under $OUT (kernel $kver; once per kernel" \
     "version, usually under a minute: download, unpack, modules, initramfs)" >&2

mkdir -p "$OUT/deb"
if ! ls "$OUT/deb/${pkg}_"*.deb >/dev/null 2>&1; then
  echo "guest: downloading $pkg" >&2
  (cd "$OUT/deb" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >/dev/null)
fi
rm -rf "$OUT/kernel" "$OUT/initramfs" "$OUT"/ready-*
dpkg-deb -x "$OUT/deb/${pkg}_"*.deb "$OUT/kernel"

# QEMU boots an uncompressed vmlinux straight away (its PVH entry point); the bzImage would first
# decompress itself, which is slow under software emulation. The payload is xz after the setup code.
python3 - "$OUT/kernel/boot/vmlinuz-$kver" "$OUT/vmlinux" <<'PY'
import lzma, sys
image = open(sys.argv[1], "rb").read()
start = image.find(b"\xfd7zXZ\x00")
if start < 0:
    sys.exit("guest: no xz payload in the kernel image")
open(sys.argv[2], "wb").write(lzma.LZMADecompressor().decompress(image[start:]))
PY

echo "guest: kernel unpacked; collecting its modules and packing the initramfs" >&2
depmod -b "$OUT/kernel" "$kver"
root="$OUT/initramfs"
mkdir -p "$root"/{bin,dev,proc,sys,host,upper,newroot,lib/modules}
cp /bin/busybox "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
# every module with its dependencies, in load order, once each (built-in ones print "builtin")
for module in "${MODULES[@]}"; do
  modprobe -d "$OUT/kernel" -S "$kver" --show-depends "$module"
done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | while read -r path; do
  cp "$path" "$root/lib/modules/"
  basename "$path"
done > "$root/lib/modules/order"
install -m 755 "$HERE/init.sh" "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$OUT/initramfs.cpio.gz"
touch "$stamp"
echo "guest: built $OUT/vmlinux and $OUT/initramfs.cpio.gz (kernel $kver)" >&2
