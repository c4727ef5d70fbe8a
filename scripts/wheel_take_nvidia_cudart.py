#!/usr/bin/env python3
"""Turns a CUDA wheel that auditwheel repaired with `--exclude libcudart.so.<major>` into one that
takes its CUDA runtime from NVIDIA's runtime wheel, the one torch installs, instead of carrying
one (scripts/build_wheel.sh --cuda runs it).

  usage: wheel_take_nvidia_cudart.py WHEEL CUDA_VERSION OUT_DIR
    CUDA_VERSION  the toolkit's MAJOR.MINOR (nvcc's "release" line), e.g. 13.0

What it changes:
- Every ELF file of the wheel that needs libcudart.so.<major> gets an RPATH entry for the folder
  where NVIDIA's runtime wheel puts it in the same site-packages ($ORIGIN/../nvidia/cu13/lib from
  trainguard/libtrainguard.so.0), after the entries into the wheel that auditwheel left; entries
  that leave the wheel (the build's /usr/local/cuda/lib) are dropped. With torch imported first,
  the loader finds libcudart.so.<major> already loaded under that name and uses torch's copy.
- The version gets the local label +cu<major> (0.1.0+cu13): the same distribution as the CPU
  wheel, so one replaces the other, and pip's resolver tells them apart.
- METADATA requires NVIDIA's runtime wheel of that major, no older than the toolkit's minor
  (nvidia-cuda-runtime>=13.0,<14), and RECORD is rewritten for the changed files.
It refuses a wheel that carries libcudart itself or links NCCL (nothing here finds torch's NCCL).
Needs patchelf on PATH.
"""
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from urllib.parse import quote

# Per CUDA major: where NVIDIA's runtime wheel puts libcudart, relative to site-packages, and
# the distribution that installs it. 13 is the one torch 2.15 (scripts/setup.sh) installs and the
# wheel test checks; 12 is the layout of torch's CUDA 12 builds, for a CUDA 12 toolkit.
NVIDIA_RUNTIME = {
    12: ("nvidia/cuda_runtime/lib", "nvidia-cuda-runtime-cu12"),
    13: ("nvidia/cu13/lib", "nvidia-cuda-runtime"),
}


def fail(message):
    sys.exit("wheel_take_nvidia_cudart: " + message)


def patchelf(*args):
    return subprocess.run(["patchelf", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def relinked_elf(name, data, cudart, runtime_dir, scratch):
    """The ELF file `name` of the wheel with an RPATH that finds runtime_dir, or None when it does
    not need libcudart."""
    path = os.path.join(scratch, "elf")
    with open(path, "wb") as f:
        f.write(data)
    needed = patchelf("--print-needed", path).split()
    if any(n.startswith("libnccl") for n in needed):
        fail(f"{name} links {[n for n in needed if n.startswith('libnccl')]}: this wheel "
             "would need an RPATH to torch's NCCL too")
    if cudart not in needed:
        return None
    folder = os.path.dirname(name)
    ours = "$ORIGIN/" + os.path.relpath(runtime_dir, folder or ".")
    kept = [e for e in patchelf("--print-rpath", path).split(":")
            if e.startswith("$ORIGIN") and e != ours]
    patchelf("--set-rpath", ":".join(kept + [ours]), path)
    with open(path, "rb") as f:
        return f.read(), ours


def renamed_in_sbom(data, old_wheel, new_wheel, new_version):
    """auditwheel's SBOM with the wheel itself (its first component) under its new name."""
    sbom = json.loads(data)
    old_ref = sbom["metadata"]["component"]["bom-ref"]
    new_ref = re.sub(r"@[^?]*\?file_name=.*$",
                     f"@{quote(new_version)}?file_name={quote(new_wheel)}", old_ref)
    sbom["metadata"]["component"].update({"bom-ref": new_ref, "purl": new_ref,
                                          "version": new_version})
    text = json.dumps(sbom, indent=2)
    return text.replace(json.dumps(old_ref), json.dumps(new_ref)).encode()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    wheel, cuda_version, out = sys.argv[1:]
    match = re.fullmatch(r"(\d+)\.(\d+)", cuda_version)
    if not match:
        fail(f"CUDA_VERSION {cuda_version!r} is not MAJOR.MINOR")
    major, minor = int(match[1]), int(match[2])
    if major not in NVIDIA_RUNTIME:
        fail(f"no NVIDIA runtime wheel known for CUDA {major} (known: {sorted(NVIDIA_RUNTIME)})")
    runtime_dir, runtime_dist = NVIDIA_RUNTIME[major]
    cudart = f"libcudart.so.{major}"
    requirement = f"{runtime_dist}<{major + 1},>={major}.{minor}"

    match = re.fullmatch(r"([^-]+)-([^-]+)-(.+)\.whl", os.path.basename(wheel))
    if not match:
        fail(f"{wheel} is not named like a wheel")
    dist, version, tags = match.groups()
    if "+" in version:
        fail(f"{wheel} already has a local version")
    new_version = f"{version}+cu{major}"
    old_info, new_info = f"{dist}-{version}.dist-info/", f"{dist}-{new_version}.dist-info/"

    with zipfile.ZipFile(wheel) as z:
        entries = [(i, z.read(i)) for i in z.infolist()]
    files, relinked = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for info, data in entries:
            name = info.filename
            if os.path.basename(name).startswith("libcudart"):
                fail(f"{wheel} carries {name}: repair it with --exclude {cudart}")
            if name == old_info + "RECORD":
                continue
            if name.startswith(old_info):
                name = new_info + name[len(old_info):]
            if name == new_info + "METADATA":
                text = data.decode()
                head, sep, body = text.partition("\n\n")
                head = re.sub(r"^Version: .*$", f"Version: {new_version}", head, flags=re.M)
                data = (head + f"\nRequires-Dist: {requirement}" + sep + body).encode()
            elif name.startswith(new_info + "sboms/") and name.endswith(".json"):
                data = renamed_in_sbom(data, wheel, f"{dist}-{new_version}-{tags}.whl",
                                       new_version)
            elif data[:4] == b"\x7fELF":
                changed = relinked_elf(name, data, cudart, runtime_dir, scratch)
                if changed:
                    data, entry = changed
                    relinked.append(f"{name} ({entry})")
            files.append((info, name, data))
    if not relinked:
        fail(f"no file of {wheel} needs {cudart}: not a CUDA build?")

    os.makedirs(out, exist_ok=True)
    target = os.path.join(out, f"{dist}-{new_version}-{tags}.whl")
    record = [record_line(name, data) for _, name, data in files if not name.endswith("/")]
    record.append(new_info + "RECORD,,")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for info, name, data in files:
            entry = zipfile.ZipInfo(name, info.date_time)
            entry.external_attr = info.external_attr  # keeps bin/trainguard executable
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
        z.writestr(zipfile.ZipInfo(new_info + "RECORD", entries[0][0].date_time),
                   "\n".join(record) + "\n")
    print(f"wheel_take_nvidia_cudart: {os.path.basename(target)}: requires {requirement}; "
          f"RPATH to it in {', '.join(relinked)}")


if __name__ == "__main__":
    main()
