"""Run a command inside a real Linux guest under QEMU, with chosen SMBIOS and firmware.

The guest is as small as it can be while still being a real machine to the program
under test: Debian's own kernel (from the ``linux-image`` package, fetched with
``apt-get download`` into a cache and unpacked with ``dpkg-deb``; nothing is installed
into the host), a busybox-static initramfs that loads the virtio and 9p modules, and a
root file system made of the host's ``/usr`` and ``/etc`` shared read-only with
``-virtfs`` (the whole of ``/`` on hosts without merged ``/usr``).  So the guest runs the
host's own ``/usr/bin/python3``, ``dmidecode`` and pyudev, but reads its identity from
the SMBIOS tables that QEMU's firmware (SeaBIOS or OVMF) built from ``-smbios``, through
the guest kernel's ``/sys/class/dmi/id`` and ``/sys/firmware/dmi``.

A second share, read-write, is a host temporary directory seen in the guest at
``/run/guest``::

    /run/guest/in/    files given to run() (the program under test, its inputs)
    /run/guest/out/   empty at start; what is here afterwards is GuestResult.files
    /run/guest/ctl/   the harness's own files (stage script, stdout, stderr, exit code)

The command runs chrooted, with a clean environment (``PATH`` the system one plus the
``env`` given), under a guest-side timeout; then the guest powers itself off.  The host
kills QEMU if the whole run exceeds its own deadline.  Under TCG one boot takes about
10 s on a slow shared machine.

Environment knobs (all optional):
    MAAS_KUBEVIRT_GUEST_CACHE     cache directory
                                  (default ${XDG_CACHE_HOME:-~/.cache}/maas-kubevirt/guest)
    MAAS_KUBEVIRT_GUEST_ACCEL     "tcg" (default) or "kvm" (opt-in: see accel())
    MAAS_KUBEVIRT_GUEST_KERNEL_PACKAGE
                                  the apt package to take the kernel from
                                  (default linux-image-amd64, then linux-image-generic)
    MAAS_KUBEVIRT_GUEST_KERNEL, MAAS_KUBEVIRT_GUEST_MODULES
                                  a vmlinuz and its /lib/modules/<version> directory to use
                                  instead of downloading one

This module has no pytest dependency: it raises GuestUnavailable(tool, reason) when
something the guest needs is missing (the tests turn that into require_tool), and
GuestError when the guest itself misbehaves (hangs, cannot mount its root, ...).
"""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import hashlib
import io
import lzma
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

# Modules the initramfs loads (with everything they depend on), when not built in.
GUEST_MODULES = ("virtio_pci", "9pnet_virtio", "9p")

GUEST_SHARE = "/run/guest"
GUEST_IN = GUEST_SHARE + "/in"
GUEST_OUT = GUEST_SHARE + "/out"
GUEST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # no /usr/local: the system python3 must run the script

OVMF_CANDIDATES = (
    "/usr/share/ovmf/OVMF.fd",
    "/usr/share/qemu/OVMF.fd",
    "/usr/share/OVMF/OVMF.fd",
)
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")  # busybox-static

# Deadline for everything the guest does besides the command: firmware, kernel,
# modules, mounts, power-off.  Generous, because TCG on a loaded 2-core machine is slow.
BOOT_BUDGET_S = 120.0

# How long a cached kernel is used before apt is asked again whether there is a newer one.
RECHECK_S = 7 * 24 * 3600


class GuestUnavailable(Exception):
    """A tool or file the guest needs is missing on this host (skip, or fail in CI)."""

    def __init__(self, tool: str, reason: str):
        super().__init__(f"{tool}: {reason}")
        self.tool = tool
        self.reason = reason


class GuestError(Exception):
    """The guest did not run the command to completion (hung, crashed, bad setup)."""


@dataclasses.dataclass
class GuestResult:
    returncode: int          # the command's exit status (124/137/143: killed by its timeout)
    stdout: str
    stderr: str
    files: dict[str, bytes]  # path relative to GUEST_OUT -> content, after the run
    console: str             # the guest's serial console (kernel + init messages)
    firmware: str
    accel: str
    seconds: float           # host wall-clock time of the whole boot-run-poweroff
    uptime_start: float | None  # guest uptime (s) when the command started
    uptime_end: float | None    # ... and when it ended


# --------------------------------------------------------------------------- tools


def cache_dir() -> Path:
    env = os.environ.get("MAAS_KUBEVIRT_GUEST_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "maas-kubevirt" / "guest"


def qemu_binary() -> str:
    path = shutil.which("qemu-system-x86_64")
    if not path:
        raise GuestUnavailable("qemu-system-x86_64", "not installed (apt-get install qemu-system-x86)")
    return path


def ovmf_firmware() -> str:
    for path in OVMF_CANDIDATES:
        if os.path.isfile(path):
            return path
    raise GuestUnavailable("ovmf", "no OVMF.fd found (apt-get install ovmf)")


def busybox_static() -> str:
    for path in BUSYBOX_CANDIDATES:
        if os.path.isfile(path) and _is_static_elf(path):
            return path
    raise GuestUnavailable("busybox", "no statically linked busybox (apt-get install busybox-static)")


def _is_static_elf(path: str) -> bool:
    # A dynamically linked ELF has a PT_INTERP program header naming its loader;
    # looking for the loader's path in the first bytes is enough to tell them apart.
    with open(path, "rb") as f:
        head = f.read(4096)
    return head[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in head and b"/lib/ld-linux" not in head


def kvm_usable() -> bool:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if fcntl.ioctl(fd, 0xAE00) != 12:  # KVM_GET_API_VERSION
            return False
        vm = fcntl.ioctl(fd, 0xAE01, 0)  # KVM_CREATE_VM
        os.close(vm)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def accel() -> str:
    """TCG unless MAAS_KUBEVIRT_GUEST_ACCEL=kvm asks for KVM.

    KVM is opt-in because a /dev/kvm that answers ioctls is no proof it can run a guest:
    under nested virtualisation (e.g. inside a Firecracker VM) QEMU either aborts on an
    MSR it cannot set or spins in the kernel forever, and TCG boots in ~10 s anyway."""
    forced = os.environ.get("MAAS_KUBEVIRT_GUEST_ACCEL", "tcg")
    if forced not in ("kvm", "tcg"):
        raise ValueError(f"MAAS_KUBEVIRT_GUEST_ACCEL must be kvm or tcg, not {forced!r}")
    if forced == "kvm" and not kvm_usable():
        raise GuestUnavailable("kvm", "MAAS_KUBEVIRT_GUEST_ACCEL=kvm but /dev/kvm is not usable")
    return forced


def guest_python() -> str:
    """The guest runs the host's system python (not a pyenv/venv one), with pyudev, and
    the host's dmidecode: both come in through the shared /usr."""
    if not os.access("/usr/bin/python3", os.X_OK):
        raise GuestUnavailable("python3", "/usr/bin/python3 missing (apt-get install python3)")
    if not any(os.access(p, os.X_OK) for p in ("/usr/sbin/dmidecode", "/usr/bin/dmidecode", "/sbin/dmidecode")):
        raise GuestUnavailable("dmidecode", "not installed for the guest (apt-get install dmidecode)")
    probe = subprocess.run(["/usr/bin/python3", "-c", "import pyudev"], capture_output=True, env={})
    if probe.returncode != 0:
        raise GuestUnavailable("pyudev", "/usr/bin/python3 cannot import pyudev (apt-get install python3-pyudev)")
    return "/usr/bin/python3"


# -------------------------------------------------------------------------- kernel


@dataclasses.dataclass
class Kernel:
    vmlinuz: Path
    modules: list[Path]   # in load order, dependencies first
    release: str


def _run(argv: list[str], cwd: str | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
    return proc.stdout


def _apt_depends(package: str) -> list[str]:
    out = _run(["apt-cache", "depends", "--important", package])
    deps = []
    for line in out.splitlines():
        m = re.match(r"\s*\|?(?:Pre)?Depends:\s*(\S+)", line)
        if m and not m.group(1).startswith("<"):
            deps.append(m.group(1))
    return deps


def _apt_candidate(package: str) -> str | None:
    out = _run(["apt-cache", "policy", package])
    m = re.search(r"Candidate:\s*(\S+)", out)
    return m.group(1) if m and m.group(1) != "(none)" else None


def _resolve_kernel_packages() -> tuple[list[str], str]:
    """(packages to download, cache key): the concrete linux-image package of the
    flavour meta-package, plus linux-modules-* where the distribution splits them out."""
    wanted = os.environ.get("MAAS_KUBEVIRT_GUEST_KERNEL_PACKAGE")
    candidates = [wanted] if wanted else ["linux-image-amd64", "linux-image-generic"]
    for meta in candidates:
        if not _apt_candidate(meta):
            continue
        image = meta
        # Follow meta-packages (linux-image-amd64 -> linux-image-6.1.0-NN-amd64) to the
        # package that ships boot/vmlinuz-*.
        for _ in range(4):
            nxt = [d for d in _apt_depends(image) if d.startswith(("linux-image-", "linux-signed-image-"))]
            if not nxt:
                break
            image = nxt[0]
        version = _apt_candidate(image)
        if not version:
            continue
        packages = [image] + [d for d in _apt_depends(image)
                              if d.startswith("linux-modules-") and not d.startswith("linux-modules-extra-")]
        return packages, f"{image}_{version}"
    raise GuestUnavailable("kernel", f"no Debian/Ubuntu kernel package among {candidates} known to apt")


def _module_name(filename: str) -> str:
    name = filename.split(".ko", 1)[0]
    return name.replace("-", "_")


def _read_module(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(data)
    if path.name.endswith(".ko.gz"):
        return gzip.decompress(data)
    if path.name.endswith(".ko.zst"):
        if not shutil.which("zstd"):
            raise GuestUnavailable("zstd", f"{path.name} is zstd-compressed (apt-get install zstd)")
        return subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    return data


def _module_closure(moddir: Path) -> list[tuple[str, Path]]:
    """GUEST_MODULES and their dependencies, dependencies first, built-ins left out.

    Debian's package has no modules.dep (depmod runs at install time), so each
    module's own `depends=` (.modinfo) is read instead."""
    builtin = set()
    if (moddir / "modules.builtin").exists():
        builtin = {_module_name(os.path.basename(l)) for l in (moddir / "modules.builtin").read_text().split()}
    files: dict[str, Path] = {}
    for dirpath, _dirs, names in os.walk(moddir):
        for n in names:
            if re.search(r"\.ko(\.(xz|gz|zst))?$", n):
                files.setdefault(_module_name(n), Path(dirpath) / n)
    order: list[tuple[str, Path]] = []
    seen: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in seen or name in builtin:
            return
        if name not in files:
            raise GuestUnavailable("kernel", f"module {name} (needed by {' <- '.join(chain) or 'the guest'}) "
                                             f"is neither built in nor shipped in {moddir}")
        seen.add(name)
        m = re.search(rb"\0depends=([^\0]*)\0", b"\0" + _read_module(files[name]))
        for dep in (m.group(1).decode().split(",") if m else []):
            if dep:
                visit(_module_name(dep), chain + (name,))
        order.append((name, files[name]))

    for name in GUEST_MODULES:
        visit(name, ())
    return order


class _Lock:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _install_kernel(src_root: Path, dest: Path) -> None:
    """From an unpacked kernel tree, keep only vmlinuz and the modules the guest loads."""
    vmlinuz = sorted((src_root / "boot").glob("vmlinuz-*"))
    moddirs = sorted(p for p in (src_root / "lib" / "modules").glob("*") if p.is_dir()) \
        if (src_root / "lib" / "modules").is_dir() else \
        sorted(p for p in (src_root / "usr" / "lib" / "modules").glob("*") if p.is_dir())
    if not vmlinuz or not moddirs:
        raise GuestUnavailable("kernel", "no boot/vmlinuz-* and lib/modules/* in the unpacked package")
    closure = _module_closure(moddirs[-1])
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest.parent))
    try:
        shutil.copyfile(vmlinuz[-1], tmp / "vmlinuz")
        (tmp / "modules").mkdir()
        for i, (name, path) in enumerate(closure):
            (tmp / "modules" / f"{i:02d}-{name}.ko").write_bytes(_read_module(path))
        (tmp / "release").write_text(moddirs[-1].name + "\n")
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_kernel(d: Path) -> Kernel:
    return Kernel(vmlinuz=d / "vmlinuz", modules=sorted((d / "modules").glob("*.ko")),
                  release=(d / "release").read_text().strip())


def kernel() -> Kernel:
    """A Debian kernel and its 9p/virtio modules, from the cache or fetched into it."""
    explicit = os.environ.get("MAAS_KUBEVIRT_GUEST_KERNEL")
    if explicit:
        moddir = os.environ.get("MAAS_KUBEVIRT_GUEST_MODULES")
        if not moddir:
            raise GuestUnavailable("kernel", "MAAS_KUBEVIRT_GUEST_KERNEL set without MAAS_KUBEVIRT_GUEST_MODULES")
        key = hashlib.sha256(f"{explicit}\0{moddir}".encode()).hexdigest()[:16]
        dest = cache_dir() / f"kernel-local-{key}"
        with _Lock(cache_dir() / ".lock"):
            if not dest.exists():
                tmp = Path(tempfile.mkdtemp(prefix=".src-", dir=cache_dir()))
                try:
                    (tmp / "boot").mkdir()
                    (tmp / "lib" / "modules").mkdir(parents=True)
                    shutil.copyfile(explicit, tmp / "boot" / "vmlinuz-local")
                    os.symlink(os.path.abspath(moddir), tmp / "lib" / "modules" / os.path.basename(moddir.rstrip("/")))
                    _install_kernel(tmp, dest)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        return _load_kernel(dest)

    cdir = cache_dir()
    cdir.mkdir(parents=True, exist_ok=True)
    with _Lock(cdir / ".lock"):
        # apt-cache takes seconds on a busy machine: ask apt for a newer kernel at most
        # once every RECHECK_S; in between the cached one is used as it is.
        fresh = [p.parent for p in cdir.glob("kernel-*/checked")
                 if not p.parent.name.startswith("kernel-local-")
                 and time.time() - p.stat().st_mtime < RECHECK_S and (p.parent / "vmlinuz").exists()]
        if fresh:
            return _load_kernel(max(fresh, key=lambda d: (d / "checked").stat().st_mtime))
        for tool in ("apt-get", "apt-cache", "dpkg-deb"):
            if not shutil.which(tool):
                cached = sorted(cdir.glob("kernel-*/vmlinuz"))
                if cached:
                    return _load_kernel(cached[-1].parent)
                raise GuestUnavailable("kernel", f"{tool} not found: cannot fetch a Debian kernel package")
        try:
            packages, key = _resolve_kernel_packages()
        except (subprocess.SubprocessError, OSError) as e:
            cached = sorted(cdir.glob("kernel-*/vmlinuz"))
            if cached:
                return _load_kernel(cached[-1].parent)
            raise GuestUnavailable("kernel", f"cannot ask apt for a kernel package: {e}") from None
        dest = cdir / f"kernel-{key}"
        if (dest / "vmlinuz").exists():
            (dest / "checked").touch()
            return _load_kernel(dest)
        work = Path(tempfile.mkdtemp(prefix=".download-", dir=cdir))
        try:
            try:
                _run(["apt-get", "download", *packages], cwd=str(work), timeout=600)
            except (subprocess.SubprocessError, OSError) as e:
                cached = sorted(cdir.glob("kernel-*/vmlinuz"))
                if cached:
                    return _load_kernel(cached[-1].parent)
                lines = (getattr(e, "stderr", None) or str(e)).strip().splitlines()
                raise GuestUnavailable("kernel", f"apt-get download {' '.join(packages)} failed: "
                                                 f"{lines[-1] if lines else e}") from None
            root = work / "root"
            for deb in sorted(work.glob("*.deb")):
                _run(["dpkg-deb", "-x", str(deb), str(root)])
            try:
                _install_kernel(root, dest)
            except GuestUnavailable:
                # Ubuntu ships 9p in linux-modules-extra-<release>: fetch it when it exists.
                extra = [p.name for p in (root / "lib" / "modules").glob("*")] if (root / "lib" / "modules").is_dir() else []
                extra = [f"linux-modules-extra-{r}" for r in extra if _apt_candidate(f"linux-modules-extra-{r}")]
                if not extra:
                    raise
                _run(["apt-get", "download", *extra], cwd=str(work), timeout=600)
                for deb in sorted(work.glob("linux-modules-extra-*.deb")):
                    _run(["dpkg-deb", "-x", str(deb), str(root)])
                _install_kernel(root, dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        # Older kernels left behind by an apt upgrade are of no further use.
        for old in cdir.glob("kernel-*"):
            if old != dest and not old.name.startswith("kernel-local-"):
                shutil.rmtree(old, ignore_errors=True)
        (dest / "checked").touch()
        return _load_kernel(dest)


# ----------------------------------------------------------------------- initramfs

# /init of the initramfs: generic, so it can be cached.  Everything specific to one run
# is in the stage script the harness writes into the shared directory.
INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in /lib/modules/*.ko; do
    insmod "$m" || echo "guest-init: insmod $m failed"
done
mkdir -p /guest
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 guest /guest; then
    sh /guest/ctl/stage.sh
    sync
    umount /guest
else
    echo "guest-init: cannot mount the guest share"
fi
echo "guest-init: powering off"
poweroff -f
sleep 5
reboot -f
"""


def _cpio_newc(entries: list[tuple[str, int, bytes, tuple[int, int]]]) -> bytes:
    """A newc cpio archive from (name, mode, data, (rdev major, minor)) entries; uid/gid 0."""
    out = io.BytesIO()

    def pad(n: int) -> None:
        out.write(b"\0" * ((4 - n % 4) % 4))

    for ino, (name, mode, data, (rmaj, rmin)) in enumerate(entries + [("TRAILER!!!", 0, b"", (0, 0))], 1):
        bname = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmaj, rmin, len(bname), 0]
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        out.write(header + bname)
        pad(len(header) + len(bname))
        out.write(data)
        pad(len(data))
    return out.getvalue()


def initramfs(k: Kernel) -> Path:
    """The busybox initramfs for kernel k (cached by content)."""
    busybox = busybox_static()
    bb = Path(busybox).read_bytes()
    mods = [(p.name, p.read_bytes()) for p in k.modules]
    h = hashlib.sha256(INIT.encode() + bb)
    for name, data in mods:
        h.update(name.encode() + hashlib.sha256(data).digest())
    path = cache_dir() / f"initramfs-{h.hexdigest()[:16]}.cpio"
    if path.exists():
        return path
    d, f, c = stat.S_IFDIR | 0o755, stat.S_IFREG, stat.S_IFCHR | 0o600
    entries = [(n, d, b"", (0, 0)) for n in ("bin", "dev", "proc", "sys", "lib", "lib/modules", "newroot")]
    entries += [("dev/console", c, b"", (5, 1)), ("dev/null", stat.S_IFCHR | 0o666, b"", (1, 3))]
    entries += [("bin/busybox", f | 0o755, bb, (0, 0)), ("init", f | 0o755, INIT.encode(), (0, 0))]
    entries += [(f"lib/modules/{name}", f | 0o644, data, (0, 0)) for name, data in mods]
    fd, tmp = tempfile.mkstemp(prefix=".initramfs-", dir=cache_dir())
    with os.fdopen(fd, "wb") as fh:
        fh.write(_cpio_newc(entries))
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- stage


def _root_shares() -> list[tuple[str, str]]:
    """(host path, guest path) shared read-only to make the chroot.

    With merged /usr (Debian 12, Ubuntu 20.04+) /usr and /etc suffice and the rest of
    the host (home directories, /work, /tmp) stays out of the guest."""
    merged = all(os.path.islink(p) and os.readlink(p).lstrip("/").startswith("usr/")
                 for p in ("/bin", "/sbin", "/lib") if os.path.lexists(p))
    if merged:
        return [("/usr", "/usr"), ("/etc", "/etc")]
    return [("/", "/")]


def _stage_script(shares: list[tuple[str, str]], command: list[str], env: dict[str, str],
                  timeout: float) -> str:
    q = shlex.quote
    lines = ["set -u", "R=/newroot", "mount -t tmpfs -o mode=0755 newroot $R"]
    for i, (host, guest) in enumerate(shares):
        lines.append(f"mkdir -p $R{q(guest)}")
        lines.append(f"mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose,ro "
                     f"root{i} $R{q(guest)} || {{ echo 'guest-stage: cannot mount {host}'; exit 1; }}")
    if shares == [("/usr", "/usr"), ("/etc", "/etc")]:
        for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            if os.path.lexists("/" + link):
                lines.append(f"ln -s {q(os.readlink('/' + link))} $R/{link}")
        lines.append("mkdir -p $R/proc $R/sys $R/dev $R/run $R/tmp $R/var/tmp $R/root")
    lines += [
        "mount -t proc proc $R/proc",
        "mount -t sysfs sysfs $R/sys",
        "mount -t devtmpfs devtmpfs $R/dev",
        "mount -t tmpfs -o mode=0755 run $R/run",
        "mount -t tmpfs -o mode=1777 tmp $R/tmp",
        f"mkdir -p $R{GUEST_SHARE}",
        f"mount -o bind /guest $R{GUEST_SHARE}",
        "cat /proc/uptime > /guest/ctl/uptime-start",
    ]
    env_args = " ".join(q(f"{k}={v}") for k, v in env.items())
    cmd = " ".join(q(c) for c in command)
    t = max(1, int(timeout))
    lines.append(f"timeout -s KILL {t} chroot $R /usr/bin/env -i {env_args} {cmd} "
                 f"</dev/null >/guest/ctl/stdout 2>/guest/ctl/stderr")
    lines.append("echo $? > /guest/ctl/rc.tmp && mv /guest/ctl/rc.tmp /guest/ctl/rc")
    lines.append("cat /proc/uptime > /guest/ctl/uptime-end")
    lines.append(f"umount $R{GUEST_SHARE}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- run


def smbios_type1(manufacturer: str = "KubeVirt", serial: str | None = "web1.vms",
                 product: str = "None", family: str = "KubeVirt", uuid: str | None = None) -> str:
    """The -smbios argument libvirt gives QEMU for a KubeVirt VM (values comma-escaped)."""
    fields = [("manufacturer", manufacturer), ("product", product)]
    if serial is not None:
        fields.append(("serial", serial))
    fields.append(("family", family))
    if uuid is not None:
        fields.append(("uuid", uuid))
    return "type=1," + ",".join(f"{k}={v.replace(',', ',,')}" for k, v in fields)


def check_available(firmware: str = "seabios") -> None:
    """Raise GuestUnavailable unless everything a boot needs is here (fetches the kernel)."""
    qemu_binary()
    busybox_static()
    guest_python()
    if firmware == "ovmf":
        ovmf_firmware()
    kernel()


def run(command: list[str], *, smbios: str | None = None, firmware: str = "seabios",
        env: dict[str, str] | None = None, files: dict[str, tuple[bytes | str, int]] | None = None,
        timeout: float = 60.0, memory_mb: int = 512) -> GuestResult:
    """Boot a guest, run command (argv) chrooted in it, power off, and report.

    files: name -> (content, mode), placed in GUEST_IN before boot.
    env: the command's whole environment besides PATH (nothing leaks from the host).
    timeout: for the command itself; the boot has BOOT_BUDGET_S on top.
    """
    if firmware not in ("seabios", "ovmf"):
        raise ValueError(f"firmware must be seabios or ovmf, not {firmware!r}")
    qemu = qemu_binary()
    k = kernel()
    initrd = initramfs(k)
    acc = accel()
    shares = _root_shares()
    genv = {"PATH": GUEST_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    genv.update(env or {})

    with tempfile.TemporaryDirectory(prefix="maas-kubevirt-guest-") as tmp:
        share = Path(tmp) / "share"
        for sub in ("in", "out", "ctl"):
            (share / sub).mkdir(parents=True)
        os.chmod(share, 0o755)
        for name, (content, mode) in (files or {}).items():
            p = share / "in" / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content.encode() if isinstance(content, str) else content)
            os.chmod(p, mode)
        (share / "ctl" / "stage.sh").write_text(_stage_script(shares, command, genv, timeout))
        console = Path(tmp) / "console.log"

        argv = [qemu, "-machine", "q35", "-accel", acc, "-cpu", "host,-arch-capabilities" if acc == "kvm" else "max", "-smp", "1",
                "-m", str(memory_mb), "-nodefaults", "-no-user-config", "-display", "none",
                "-monitor", "none", "-serial", f"file:{console}", "-no-reboot",
                "-kernel", str(k.vmlinuz), "-initrd", str(initrd),
                "-append", "console=ttyS0 panic=-1 loglevel=4 mitigations=off tsc=reliable"]
        if firmware == "ovmf":
            argv += ["-bios", ovmf_firmware()]
        if smbios:
            argv += ["-smbios", smbios]
        for i, (host, _guest) in enumerate(shares):
            argv += ["-virtfs", f"local,path={host},mount_tag=root{i},security_model=none,"
                                f"readonly=on,multidevs=remap"]
        argv += ["-virtfs", f"local,path={share},mount_tag=guest,security_model=none"]

        deadline = BOOT_BUDGET_S + timeout
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            qemu_out, _ = proc.communicate(timeout=deadline)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise GuestError(f"guest ({firmware}, {acc}) still running after {deadline:.0f} s, killed; "
                             f"console tail:\n{_tail(console)}") from None
        seconds = time.monotonic() - start
        console_text = console.read_text(errors="replace") if console.exists() else ""
        ctl = share / "ctl"
        if not (ctl / "rc").exists():
            raise GuestError(f"guest ({firmware}, {acc}) exited {proc.returncode} without running the "
                             f"command; qemu said: {qemu_out.decode(errors='replace').strip()}\n"
                             f"console tail:\n{_tail(console)}")
        out_files = {}
        for p in sorted((share / "out").rglob("*")):
            if p.is_file() or p.is_symlink():
                out_files[str(p.relative_to(share / "out"))] = p.read_bytes() if p.is_file() else b""
        return GuestResult(
            returncode=int((ctl / "rc").read_text().strip()),
            stdout=(ctl / "stdout").read_text(errors="replace"),
            stderr=(ctl / "stderr").read_text(errors="replace"),
            files=out_files, console=console_text, firmware=firmware, accel=acc,
            seconds=seconds, uptime_start=_uptime(ctl / "uptime-start"),
            uptime_end=_uptime(ctl / "uptime-end"))


def _uptime(path: Path) -> float | None:
    try:
        return float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no console output)"


if __name__ == "__main__":  # manual check: python3 tests/guest.py [seabios|ovmf] [cmd...]
    import sys
    fw = sys.argv[1] if len(sys.argv) > 1 else "seabios"
    cmd = sys.argv[2:] or ["dmidecode", "-s", "system-serial-number"]
    r = run(cmd, smbios=smbios_type1(), firmware=fw)
    print(f"rc={r.returncode} {r.firmware}/{r.accel} {r.seconds:.1f}s "
          f"(command at guest uptime {r.uptime_start}..{r.uptime_end})")
    print("stdout:", r.stdout, end="")
    print("stderr:", r.stderr, end="")
