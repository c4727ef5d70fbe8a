#!/usr/bin/env python3
"""The self-contained wheel (scripts/build_wheel.sh) installs and runs on a machine image that has
Python and none of the build's libraries (label `wheel`); with --cuda, the CUDA wheel
(scripts/build_wheel.sh --cuda) does, with the CUDA runtime of NVIDIA's wheel that torch installs.

The image is a root file system made of the files of the Debian packages Python's venv needs
(python3-venv and what it depends on, as installed here) plus libstdc++6, which every Debian image
holds through apt and which manylinux wheels take from the system. It has no Abseil, protobuf,
xxhash, liburing, libcurl, CUDA or compiler: the test checks that before using it. The test
enters it with chroot in new mount and PID namespaces (its own /proc, /dev/shm and /tmp, and a
/dev holding only null, zero, full, random and urandom), so the only libraries a process there can
load are the image's and the wheel's. There it makes a fresh virtual environment, installs the wheel with pip
offline (pip resolves its requirements from the wheels given), imports trainguard, runs a Runtime
of a one-rank job through a good step and a failed, recovered one, checks from /proc/self/maps that
Abseil and protobuf came from the wheel, and runs the `trainguard` command.

The CUDA wheel is installed with NVIDIA's runtime wheel of its CUDA major (the version torch
installs, downloaded once with pip into WORK_DIR), which pip must pick from the wheel's own
requirement. The image has no CUDA toolkit and no GPU driver, so the guarded step runs the SDK's
host paths after the CUDA runtime finds no device, as on a machine without a GPU. Besides the
above it checks that the wheel carries no libcudart and links no NCCL, that the dynamic loader
(`ld.so --list`) resolves the extension's libcudart to site-packages/nvidia/.../lib, and that the
process loaded that copy and no other. A GPU is not used.

  usage: wheel_clean_root_test.py [--cuda] SOURCE_DIR WORK_DIR
  TG_WHEEL=path/to.whl  test that wheel instead of building one with scripts/build_wheel.sh
The image is cached in WORK_DIR under a hash of its packages' versions, and the wheel's build
folder is kept there, so a rerun rebuilds only what changed.
"""
import fnmatch
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile

# What the image is made of; see the docstring.
IMAGE_PACKAGES = ["python3-venv", "libstdc++6"]
# Libraries of a source build that must not be in the image (shell-style patterns of file names).
BUILD_LIBRARIES = ["libabsl_*", "libprotobuf*", "libprotoc*", "libxxhash*", "liburing*", "libcurl*",
                   "libcudart*", "libnccl*", "libgtest*", "libgloo*"]
# Bump when the way the image is made changes, so that a cached one is remade.
IMAGE_FORMAT = "1"
# Per CUDA major: NVIDIA's runtime wheel that torch installs (torch 2.15.0, scripts/setup.sh, for
# 13) and where it puts libcudart relative to site-packages.
NVIDIA_RUNTIME = {13: ("nvidia-cuda-runtime==13.2.86", "nvidia/cu13/lib/libcudart.so.13")}

IN_ROOT = r'''
import os, subprocess, sys
venv = "/tmp/venv"

def run(*argv):
    shown = argv[:argv.index("-c") + 1] + ("...",) if "-c" in argv else argv
    print("in the image: " + " ".join(shown), flush=True)
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"`{' '.join(shown)}` failed ({r.returncode}):\n{r.stdout}")
    return r.stdout

run(sys.executable, "-m", "venv", venv)
run(venv + "/bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
    "--no-index", "--find-links", "/tmp/wheelhouse", "trainguard")
print(run(venv + "/bin/python", "-m", "pip", "list", "--disable-pip-version-check"), end="")
if CUDART:
    # What the dynamic loader resolves for the extension, as ldd shows it.
    site = run(venv + "/bin/python", "-c",
               "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    extension, = [f for f in os.listdir(site + "/trainguard") if f.startswith("_C.")]
    listing = run("/lib64/ld-linux-x86-64.so.2", "--list", f"{site}/trainguard/{extension}")
    resolved = [line.split("=>")[1].split()[0] for line in listing.splitlines()
                if line.strip().startswith("libcudart")]
    assert len(resolved) == 1 and os.path.realpath(resolved[0]) == f"{site}/{CUDART}", listing
    assert "libnccl" not in listing, listing
    print(f"in the image: ld.so --list trainguard/{extension}: libcudart => {resolved[0]}")
print(run(venv + "/bin/python", "-c", CHECK), end="")
help_text = run(venv + "/bin/trainguard", "--help")
assert "trainguard" in help_text and "run" in help_text, help_text
print("in the image: `trainguard --help` printed %d lines" % len(help_text.splitlines()))
'''

CHECK = r'''
import importlib.util, os, sysconfig, tempfile
import trainguard
assert trainguard.__file__.startswith("/tmp/venv/"), trainguard.__file__
assert importlib.util.find_spec("torch") is None
with tempfile.TemporaryDirectory() as d:
    with trainguard.Runtime(job_id="wheel-clean-root", world_size=1, run_dir=d) as rt:
        step = rt.start()
        assert step == 0, step
        with rt.step(step) as s:
            s.check_loss(0.5)
        assert s.result.ok, s.result
        with rt.step(step + 1) as s:
            raise trainguard.RecoverableError("bad batch")
        assert not s.result.ok
        assert rt.recover(s.result) == step + 2
loaded = sorted({line.split()[-1] for line in open("/proc/self/maps") if ".so" in line})
for lib in loaded:
    name = os.path.basename(lib)
    if name.startswith(("libabsl_", "libprotobuf", "libxxhash", "liburing", "libcurl",
                        "libtrainguard")):
        assert "/site-packages/trainguard" in lib, "loaded from outside the wheel: " + lib
cudart = [lib for lib in loaded if os.path.basename(lib).startswith("libcudart")]
if CUDART:
    assert cudart == [os.path.join(sysconfig.get_paths()["purelib"], CUDART)], cudart
    print("in the image: the CUDA runtime came from", cudart[0])
else:
    assert not cudart, cudart
assert not [lib for lib in loaded if os.path.basename(lib).startswith(("libnccl", "libcuda."))]
vendored = [os.path.basename(l) for l in loaded if "/site-packages/trainguard.libs/" in l]
print("in the image: trainguard", trainguard.__version__, "ran a guarded step with",
      len(vendored), "libraries from the wheel's trainguard.libs/, e.g.", ", ".join(vendored[:3]))
'''


def fail(message):
    sys.exit("wheel_clean_root_test: " + message)


def installed_packages():
    """{name: (version, [dependency alternatives], [provided names])} of installed packages."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\t${Version}\t${Pre-Depends}, "
         "${Depends}\t${Provides}\n"], check=True, capture_output=True, text=True).stdout
    packages, providers = {}, {}
    for line in out.splitlines():
        name, status, version, depends, provides = line.split("\t")
        if not status.startswith("ii"):
            continue
        alternatives = [[re.sub(r"\(.*?\)", "", a).strip().split(":")[0] for a in group.split("|")]
                        for group in depends.split(",") if group.strip()]
        packages[name] = (version, alternatives)
        for p in provides.split(","):
            if p.strip():
                providers.setdefault(re.sub(r"\(.*?\)", "", p).strip().split(":")[0], name)
    return packages, providers


def package_closure(roots):
    packages, providers = installed_packages()
    seen, todo = {}, list(roots)
    while todo:
        name = todo.pop()
        name = name if name in packages else providers.get(name, name)
        if name in seen:
            continue
        if name not in packages:
            fail(f"the image needs the Debian package {name}, which is not installed here")
        version, alternatives = packages[name]
        seen[name] = version
        for group in alternatives:
            pick = next((a if a in packages else providers[a] for a in group
                         if a in packages or a in providers), None)
            # None: no package of this alternative is installed here, so it is optional.
            if pick is not None:
                todo.append(pick)
    return seen


def copy_into(root, path):
    """Copies the host's `path` (a file or symlink) into root, below the real folder it is in (the
    host's /lib is a link to /usr/lib; the image has the same links)."""
    folder = root + os.path.realpath(os.path.dirname(path))
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, os.path.basename(path))
    if os.path.islink(path):
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
    elif os.path.isdir(path):
        os.makedirs(root + os.path.realpath(path), exist_ok=True)
    elif os.path.isfile(path):
        shutil.copy2(path, target)


def make_image(work):
    closure = package_closure(IMAGE_PACKAGES)
    key = hashlib.sha256((IMAGE_FORMAT + "\n" + "\n".join(
        f"{n}={v}" for n, v in sorted(closure.items()))).encode()).hexdigest()[:12]
    root = os.path.join(work, "image-" + key)
    if os.path.exists(os.path.join(root, ".complete")):
        return root, closure
    for old in glob.glob(os.path.join(work, "image-*")):
        shutil.rmtree(old)
    making = root + ".making"
    os.makedirs(making)
    for link in ("bin", "sbin", "lib", "lib64"):  # Debian 12's merged /usr
        if os.path.islink("/" + link):
            os.symlink(os.readlink("/" + link), os.path.join(making, link))
    listing = subprocess.run(["dpkg-query", "-L", *sorted(closure)], check=True,
                             capture_output=True, text=True).stdout
    for path in listing.splitlines():
        if path.startswith("/") and os.path.lexists(path) and path != "/.":
            copy_into(making, path)
    for folder, mode in (("tmp", 0o1777), ("proc", 0o555), ("dev", 0o755), ("root", 0o700),
                         ("etc", 0o755)):
        os.makedirs(os.path.join(making, folder), exist_ok=True)
        os.chmod(os.path.join(making, folder), mode)
    with open(os.path.join(making, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
    with open(os.path.join(making, "etc/group"), "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\n")
    with open(os.path.join(making, "etc/ld.so.conf"), "w") as f:
        f.write("include /etc/ld.so.conf.d/*.conf\n")
    subprocess.run(["ldconfig", "-r", making], check=True)
    with open(os.path.join(making, ".complete"), "w") as f:
        f.write("".join(f"{n} {v}\n" for n, v in sorted(closure.items())))
    os.rename(making, root)
    return root, closure


def check_image_lacks_build_libraries(root):
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if any(fnmatch.fnmatch(name, p) for p in BUILD_LIBRARIES):
                found.append(os.path.join(folder, name)[len(root):])
    if found:
        fail("the image holds libraries of the build: " + ", ".join(found[:10]))
    for tool in ("usr/bin/cmake", "usr/bin/gcc", "usr/bin/g++", "usr/bin/protoc", "usr/local/cuda"):
        if os.path.lexists(os.path.join(root, tool)):
            fail("the image holds a build tool: /" + tool)


def build_wheel(source, work, cuda):
    dist = os.path.join(work, "dist")
    env = dict(os.environ, TG_WHEEL_WORK_DIR=os.path.join(work, "wheel-build"))
    variant = ["--cuda"] if cuda else []
    subprocess.run([os.path.join(source, "scripts", "build_wheel.sh"), *variant, dist], check=True,
                   env=env)
    wheels = [w for w in glob.glob(os.path.join(dist, "trainguard-*manylinux*.whl"))
              if ("+cu" in w) == cuda]
    if len(wheels) != 1:
        fail(f"scripts/build_wheel.sh left {wheels} in {dist}")
    return wheels[0]


def cuda_runtime_wheel(wheel, work):
    """(NVIDIA's runtime wheel for the CUDA wheel `wheel`, libcudart's path in site-packages),
    after checking that the wheel carries no CUDA runtime and links no NCCL and requires that
    runtime wheel."""
    major = int(re.search(r"\+cu(\d+)-", os.path.basename(wheel))[1])
    if major not in NVIDIA_RUNTIME:
        fail(f"no NVIDIA runtime wheel known for {os.path.basename(wheel)}")
    pin, cudart = NVIDIA_RUNTIME[major]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    carried = [n for n in names if os.path.basename(n).startswith(("libcudart", "libnccl"))]
    if carried:
        fail(f"{wheel} carries {carried}")
    runtime = pin.split("==")[0]
    if not re.search(rf"^Requires-Dist: {re.escape(runtime)}<{major + 1},>={major}\.", metadata,
                     re.M):
        fail(f"{wheel} does not require {runtime} of CUDA {major}:\n{metadata[:2000]}")
    # Downloaded once; a fresh virtual environment's pip, as the machine has no other.
    folder = os.path.join(work, "nvidia-wheels")
    found = glob.glob(os.path.join(folder, pin.replace("-", "_").replace("==", "-") + "-*.whl"))
    if not found:
        pip = os.path.join(work, "pip")
        if not os.path.exists(os.path.join(pip, "bin", "python")):
            subprocess.run(["/usr/bin/python3", "-m", "venv", pip], check=True)
        subprocess.run([os.path.join(pip, "bin", "python"), "-m", "pip", "download", "-q",
                        "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
                        "-d", folder, pin], check=True)
        found = glob.glob(os.path.join(folder, pin.replace("-", "_").replace("==", "-") + "-*.whl"))
    if len(found) != 1:
        fail(f"expected one wheel of {pin} in {folder}, found {found}")
    return found[0], cudart


def run_in_image(root, wheels, cudart, work):
    script = os.path.join(work, "in_root.py")
    with open(script, "w") as f:
        f.write(f"CUDART = {cudart!r}\nCHECK = {('CUDART = %r' % cudart) + CHECK!r}\n{IN_ROOT}")
    # Mounts made in the new mount namespace vanish with it; /tmp and /dev/shm are fresh tmpfs.
    enter = r'''
set -eu
R=$1
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=755 tmpfs "$R/dev"
for d in null zero full random urandom; do
  touch "$R/dev/$d"
  mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir "$R/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
cp "$2" "$R/tmp/in_root.py"
mkdir "$R/tmp/wheelhouse"
shift 2
cp "$@" "$R/tmp/wheelhouse/"
exec env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
  /usr/sbin/chroot "$R" /usr/bin/python3 -I /tmp/in_root.py
'''
    unshare = ["unshare", "--mount", "--pid", "--fork", "--kill-child"]
    if os.getuid() != 0:
        unshare.insert(1, "--map-root-user")
    probe = subprocess.run(unshare + ["true"], capture_output=True, text=True)
    if probe.returncode != 0:  # not root, and no unprivileged user namespaces: ctest reports a skip
        print("wheel_clean_root_test: skipped: cannot enter the image: " + probe.stderr.strip())
        sys.exit(77)
    r = subprocess.run(unshare + ["/bin/sh", "-c", enter, "sh", root, script, *wheels])
    if r.returncode != 0:
        fail(f"the wheel failed in the image {root} ({r.returncode})")


def main():
    args = sys.argv[1:]
    cuda = args[:1] == ["--cuda"]
    if cuda:
        args = args[1:]
    if len(args) != 2:
        sys.exit(__doc__)
    source, work = (os.path.abspath(a) for a in args)
    os.makedirs(work, exist_ok=True)
    wheel = os.environ.get("TG_WHEEL") or build_wheel(source, work, cuda)
    if not re.search(r"-manylinux_\d+_\d+_x86_64\.whl$", wheel):
        fail(f"{wheel} has no manylinux tag")
    if ("+cu" in os.path.basename(wheel)) != cuda:
        fail(f"{wheel} is not a {'CUDA' if cuda else 'CPU'} wheel")
    wheels, cudart = [wheel], None
    if cuda:
        runtime, cudart = cuda_runtime_wheel(wheel, work)
        wheels.append(runtime)
    root, closure = make_image(work)
    check_image_lacks_build_libraries(root)
    print(f"wheel_clean_root_test: image {root}: {len(closure)} Debian packages "
          f"({', '.join(IMAGE_PACKAGES)} and their dependencies), no library of the build")
    run_in_image(root, wheels, cudart, work)
    print(f"wheel_clean_root_test: {os.path.basename(wheel)} installed and ran in the image: "
          "1 passed")


if __name__ == "__main__":
    main()
