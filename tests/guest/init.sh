#!/bin/sh
# /init of the test guest (busybox): load the modules, make the host's root (shared read-only over
# 9p) writable with an overlay, mount cgroup2 alone at /sys/fs/cgroup, run the harness's script
# from the "out" share (read-write) in that root, then power off. Console lines starting with
# "hsg:" are for the harness.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "hsg: booted $(uname -r)"
while read -r module; do
  insmod "/lib/modules/$module" || echo "hsg: insmod $module failed"
done < /lib/modules/order
fail() { echo "hsg: $*"; echo "hsg: exit 255"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose host /host || fail "9p mount of the host failed"
mount -t tmpfs -o size=768m tmpfs /upper && mkdir /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/host,upperdir=/upper/u,workdir=/upper/w /newroot || fail "overlay root failed"
for d in proc sys dev; do mount --bind "/$d" "/newroot/$d"; done
mkdir -p /hosttmp && mount --bind /newroot/tmp /hosttmp  # the host's /tmp, before the tmpfs hides it
mount -t tmpfs -o size=1g,mode=1777 tmpfs /newroot/tmp  # stores and layers: not on the overlay root
repo=$(sed -n 's/.*hsg_repo=\([^ ]*\).*/\1/p' /proc/cmdline)
case "$repo" in  # a checkout under /tmp (a CI clone, say) is shown again at its own path
  /tmp/?*) mkdir -p "/newroot$repo" && mount --bind "/hosttmp${repo#/tmp}" "/newroot$repo" || fail "no $repo" ;;
esac
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup || fail "no cgroup2"
mkdir -p /newroot/run/hsg-out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 out /newroot/run/hsg-out || fail "9p mount of out failed"
echo "hsg: ready after $(cut -d" " -f1 /proc/uptime) s"
# The new root is moved over the initramfs and entered from there, as switch_root does (not a chroot
# into /newroot): the kernel refuses user namespaces to a chrooted process, and the rootless tests
# and root mode's own user namespaces need them. This shell keeps the initramfs as its root (its
# busybox, for poweroff) and the new root as its directory.
cd /newroot && mount --move . / || fail "moving the new root failed"
chroot . /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 TERM=dumb /bin/sh /run/hsg-out/run.sh
echo "hsg: exit $?"
umount run/hsg-out
poweroff -f
