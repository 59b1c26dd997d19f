"""The device bundle on 64-bit ARM, under emulation: what .ci/run checks, and
docs/reference/device.md.

An arm64 Debian bookworm userland (Python 3.11, as 64-bit Raspberry Pi OS), unpacked from
Debian's own packages (from the archive this machine's apt sources name for bookworm main)
into ~/.cache/psa-edge/arm64-bookworm (reused once built), runs under
qemu user-mode emulation (registered with the kernel's binfmt_misc) in a chroot with its own
mount namespace, which shows the guest an ARM /proc/cpuinfo (onnxruntime reads it at import;
the host's x86 one crashes it). The bundle of the shipped
model's ONNX artifacts (and the twin) is copied in, its requirements are installed exactly as
its README tells a Pi user (a venv, `pip install -r requirements-onnx.txt`, aarch64 wheels from
PyPI), and its commands run there: generate, bench (small), verify (torch-free, against the
reference logits recorded at export). A fixed probe's logits must equal this machine's to fp32
tolerance.

    python .ci/arm64_check.py [--doc]     # --doc: rewrite docs/reference/device.md's measured block

Exit 0: passed; 1: a check failed; 3: skipped, with the reason on stderr (not root, no
qemu-user-static and no way to install it, no binfmt_misc, or no network to Debian and PyPI).
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
APT_SOURCES = Path("/etc/apt")
ROOTFS = Path(os.environ.get("PSA_EDGE_ARM64_ROOT",
                             Path.home() / ".cache" / "psa-edge" / "arm64-bookworm"))
PACKAGES = ["python3.11", "python3.11-venv", "python3-pip-whl", "python3-setuptools-whl",
            "libstdc++6", "libgcc-s1", "dash", "coreutils"]
CPUINFO = "".join(f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 "
                  f"cpuid\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
                  f"CPU part\t: 0xd08\nCPU revision\t: 3\n\n" for i in range(4))  # Cortex-A72
PROBE = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
SKIP = 3


def skip(reason: str) -> None:
    print(f"arm64 check skipped: {reason}", file=sys.stderr)
    sys.exit(SKIP)


BINFMT = Path("/proc/sys/fs/binfmt_misc")
# The kernel runs aarch64 ELF files through qemu ("F": opened now, so it works in a chroot).
AARCH64_ELF = (r":qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00"
               r"\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff"
               r"\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:F")


def tools() -> None:
    """qemu-user-static installed and registered for aarch64 binaries; root for the chroot."""
    if os.geteuid() != 0:
        skip("the emulated userland needs root (a mount namespace and chroot)")
    if not shutil.which("qemu-aarch64-static"):
        done = subprocess.run("apt-get install -y -q qemu-user-static || (apt-get update -q && "
                              "apt-get install -y -q qemu-user-static)", shell=True,
                              capture_output=True, text=True)
        if done.returncode or not shutil.which("qemu-aarch64-static"):
            skip(f"apt-get could not install qemu-user-static: {done.stderr[-300:]}")
    if not (BINFMT / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)],
                       capture_output=True)
    if not (BINFMT / "qemu-aarch64").exists():
        try:
            (BINFMT / "register").write_text(AARCH64_ELF)
        except OSError as exc:
            skip(f"cannot register qemu-aarch64 with binfmt_misc ({exc.strerror}): this "
                 f"machine cannot run foreign binaries")


def apt_entries(root: Path = APT_SOURCES) -> list[dict[str, list[str]]]:
    """This machine's apt sources, each as {"Types", "URIs", "Suites", "Components"}: the
    deb822 `.sources` files and the one-line `sources.list` form."""
    entries = []
    for path in sorted((root / "sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in stanza.splitlines()
                          if ":" in line and not line.startswith(("#", " ")))
            entries.append({k: fields.get(k, "").split() for k in
                            ("Types", "URIs", "Suites", "Components")})
    for path in [root / "sources.list", *sorted((root / "sources.list.d").glob("*.list"))]:
        lines = path.read_text().splitlines() if path.is_file() else []
        for line in lines:  # deb [arch=... signed-by=...] URI SUITE COMPONENT...
            words = re.sub(r"\[[^]]*\]", " ", line.split("#")[0]).split()
            if len(words) >= 4:
                entries.append({"Types": words[:1], "URIs": words[1:2], "Suites": words[2:3],
                                "Components": words[3:]})
    return entries


def mirror(root: Path = APT_SOURCES) -> str:
    """The Debian archive this machine's apt configuration names for bookworm's main."""
    for entry in apt_entries(root):
        if "deb" in entry["Types"] and SUITE in entry["Suites"] \
                and "main" in entry["Components"] and entry["URIs"]:
            return entry["URIs"][0].rstrip("/")
    skip(f"no apt source of this machine serves Debian {SUITE} main")


def index(archive: str) -> dict[str, dict]:
    url = f"{archive}/dists/{SUITE}/main/binary-arm64/Packages.xz"
    try:
        text = lzma.decompress(urllib.request.urlopen(url, timeout=60).read()).decode()
    except OSError as exc:
        skip(f"cannot reach {url}: {exc}")
    packages = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        if "Package" in fields:
            packages[fields["Package"]] = fields
            for provided in fields.get("Provides", "").split(","):
                packages.setdefault(provided.split("(")[0].strip(), fields)
    return packages


def closure(packages: dict, wanted: list[str]) -> list[dict]:
    """The packages and everything they depend on (first alternative of each)."""
    seen, todo, out = set(), list(wanted), []
    while todo:
        name = todo.pop()
        entry = packages.get(name)
        if entry is None or entry["Package"] in seen:
            continue
        seen.add(entry["Package"])
        out.append(entry)
        for field in ("Pre-Depends", "Depends"):
            for dep in filter(None, entry.get(field, "").split(",")):
                todo.append(dep.split("|")[0].split("(")[0].split(":")[0].strip())
    return out


def build_rootfs() -> float:
    stamp = ROOTFS / ".psa-edge-complete"
    if stamp.exists():
        return 0.0
    started = time.time()
    shutil.rmtree(ROOTFS, ignore_errors=True)
    ROOTFS.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = mirror()
        for entry in closure(index(archive), PACKAGES):
            deb = Path(tmp) / Path(entry["Filename"]).name
            urllib.request.urlretrieve(f"{archive}/{entry['Filename']}", deb)
            subprocess.run(["dpkg-deb", "-x", deb, ROOTFS], check=True)
    # The network configuration and CA bundle of this (Debian) host: the data a Pi has.
    for name in ("etc/resolv.conf", "etc/hosts", "etc/ssl/certs/ca-certificates.crt"):
        (ROOTFS / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f"/{name}", ROOTFS / name)
    (ROOTFS / "tmp").mkdir(exist_ok=True)
    (ROOTFS / "root").mkdir(exist_ok=True)
    for link, target in (("usr/bin/python3", "python3.11"), ("bin/sh", "dash")):
        (ROOTFS / link).unlink(missing_ok=True)
        (ROOTFS / link).symlink_to(target)
    stamp.write_text(time.ctime())
    return time.time() - started


def guest(command: str, cwd: str = "/root", timeout: int = 900) -> subprocess.CompletedProcess:
    """`command` in the arm64 userland: a private mount namespace with its own /proc, an ARM
    /proc/cpuinfo bound over the host's and /dev, then chroot."""
    root, cpuinfo = ROOTFS, ROOTFS / ".cpuinfo"
    cpuinfo.write_text(CPUINFO)
    for folder in ("proc", "dev"):
        (root / folder).mkdir(exist_ok=True)
    setup = (f"mount -t proc proc {root}/proc && mount --bind {cpuinfo} {root}/proc/cpuinfo && "
             f"mount --rbind /dev {root}/dev && exec chroot {root} /bin/sh -c "
             f"'export PATH=/root/psa/bin:/usr/bin:/bin && cd \"$GUEST_CWD\" && "
             f"eval \"$GUEST_COMMAND\"'")
    env = {"HOME": "/root", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "PSA_EDGE_CACHE": "/root/.cache/psa-edge", "GUEST_CWD": cwd,
           "GUEST_COMMAND": command}
    return subprocess.run(["unshare", "--mount", "--fork", "sh", "-c", setup],
                          capture_output=True, text=True, timeout=timeout, env=env)


def host(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "psa_edge.cli", *args], capture_output=True,
                          text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"psa-edge {' '.join(args)} failed on the host:\n{done.stderr}")
    return done.stdout


def probe_logits(python: str) -> str:
    return (f"{python} -c \"import json, sys; from psa_edge.runtime.session import open_session; "
            f"s = open_session('models/psa'); print(json.dumps(s.feed({PROBE}).tolist()))\"")


def write_doc_block(report: dict, steps: list) -> None:
    """docs/reference/device.md's block between `<!-- arm64:begin -->` and `<!-- arm64:end -->`."""
    machine, python, numpy, onnxruntime, size = report["versions"].split()[:5]
    installed = ", ".join(report["versions"].split()[6:])
    ratio = report["bench"]["ratio_psa_over_twin"]["tg16_time"]["median"]
    lines = [f"Run by `python .ci/arm64_check.py --doc` ({time.strftime('%Y-%m-%d')}): Debian "
             f"bookworm arm64, Python {python} ({machine}) under qemu-aarch64 "
             f"{qemu_version()} (binfmt_misc, chroot). The bundle's `requirements-onnx.txt` "
             f"installed numpy {numpy} and onnxruntime {onnxruntime}, in all ({installed}): "
             f"the venv takes {size} MB. Commands "
             f"(in the bundle folder), with their wall time under emulation on this x86 "
             f"machine (a measure of emulation, not of a Pi):", "", "| step | command | "
             "seconds |", "|---|---|---|"]
    lines += [f"| {name} | `{command}` | {report[f'{name}_seconds']} |"
              for name, command in steps if name != "versions"]
    lines += ["", f"A 16-token probe's logits on arm64 differ from this machine's by at most "
              f"{report['probe_max_abs_diff']:.1e} (tolerance {report['probe_tolerance']:.1e}); "
              f"verify passed against {report['verify']['reference']}; generate wrote "
              f"`{report['generate']!r}`; bench's PSA/twin decode time ratio (1 repetition, "
              f"emulated): {ratio:.3f}."]
    path = REPO / "docs" / "reference" / "device.md"
    text = path.read_text()
    head, rest = text.split("<!-- arm64:begin -->", 1)
    path.write_text(head + "<!-- arm64:begin -->\n" + "\n".join(lines) + "\n"
                    + "<!-- arm64:end -->" + rest.split("<!-- arm64:end -->", 1)[1])


def qemu_version() -> str:
    done = subprocess.run(["qemu-aarch64-static", "--version"], capture_output=True, text=True)
    return done.stdout.split("version")[1].split()[0] if "version" in done.stdout else "?"


def main() -> None:
    import numpy as np

    tools()
    report = {"rootfs_build_seconds": round(build_rootfs(), 1)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("psa", []), ("twin", ["--twin"])):
            host("export", "models/psa-default.pt", "--target", "onnx", *extra, "-o",
                 f"{tmp}/{name}")
        bundle = ROOTFS / "root" / "bundle"
        shutil.rmtree(bundle, ignore_errors=True)
        host("bundle", f"{tmp}/psa", f"{tmp}/twin", "-o", str(bundle))
        x86 = np.array(json.loads(subprocess.run(
            ["sh", "-c", probe_logits(sys.executable)], cwd=bundle, capture_output=True,
            text=True, check=True).stdout))
    steps = [("install", "rm -rf /root/psa && python3 -m venv /root/psa && "
                         "pip install -q -r requirements-onnx.txt"),
             ("versions", "python -c \"import platform, sys, numpy, onnxruntime; print(platform."
                          "machine(), sys.version.split()[0], numpy.__version__, "
                          "onnxruntime.__version__)\" && du -sm /root/psa && pip freeze"),
             ("generate", "./psa-edge generate models/psa --prompt-ids 1,2,3,1,2 -n 8 --json"),
             ("bench", "./psa-edge bench models/psa --vs models/twin -p 16 -n 16 -r 1 --json"),
             ("verify", "./psa-edge verify models/psa --json"),
             ("probe", probe_logits("python"))]
    passed = True
    for name, command in steps:
        started = time.time()
        done = guest(command, cwd="/root/bundle")
        report[f"{name}_seconds"] = round(time.time() - started, 1)
        if done.returncode:
            print(f"arm64 {name} failed:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}",
                  file=sys.stderr)
            passed = False
            break
        report[name] = done.stdout.strip()
        print(f"arm64 {name}: ok in {report[f'{name}_seconds']} s", flush=True)
    if passed:
        arm = np.array(json.loads(report.pop("probe")))
        scale = max(1.0, float(np.abs(x86).max()))
        report["probe_max_abs_diff"] = float(np.abs(arm - x86).max())
        report["probe_tolerance"] = 1e-5 * scale
        verify = json.loads(report["verify"])
        passed = report["probe_max_abs_diff"] <= report["probe_tolerance"] and verify["passed"]
        report["verify"] = {"passed": verify["passed"], "reference": verify["reference"]}
        report["generate"] = json.loads(report["generate"])["text"]
        report["bench"] = {k: v for k, v in json.loads(report["bench"]).items()
                           if k in ("ratio_psa_over_twin",)}
    out = REPO / "out" / "arm64"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    if passed and "--doc" in sys.argv:
        write_doc_block(report, steps)
    print(json.dumps({k: v for k, v in report.items() if k != "bench"}, indent=1))
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
