"""`sapo-bench package`: the packaged app on a clean Debian, as a new user gets it.

Takes the .deb (and the tarball) that `installer/package.sh` built and, in a minimal Debian root
made from Debian's packages (`mmdebstrap --variant=apt`: no compiler, no Python, no X; cached
as a tar after the first run), does what a new user does:

1. `apt-get install ./sapo-swarm_V_amd64.deb` (timed; apt fetches the system libraries the
   package depends on from Debian's mirror, the only network this benchmark uses);
2. `sapo-node doctor` as an ordinary user with an empty home;
3. `sapo-node run --alone --rounds 1` (timed: the first round, from the command to its end);
4. `sapo-swarm --screenshots DIR` on an X display (Xvfb, installed after the package so it
   cannot supply a library the package forgot): Qt's xcb window, not the offscreen one; and
   doctor's display check there;
5. the tarball, unpacked into the user's home, answers from there, and its install-user.sh
   installs it (no root) in the layout the updater keeps, then removes it;
6. `apt-get remove sapo-swarm`: the commands are gone, the user's runs stay.

Needs root (chroot, mounts). Ends with one line: package sizes, install time (goal <= 120 s on
2 cores), first-round time, and whether each step passed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_GOAL_S = 120.0
USER, UID = "volunteer", 1000
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COMPILERS = ("cc", "gcc", "c++", "g++", "clang")


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sapo-swarm" / "bench"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deb", required=True, type=Path, help="the .deb installer/package.sh wrote")
    p.add_argument("--tarball", type=Path, help="the tarball installer/package.sh wrote (step 5)")
    p.add_argument("--suite", default="bookworm", help="the Debian release of the clean root")
    p.add_argument("--cache", type=Path, default=None, help="where the clean root's tar is kept between runs")
    p.add_argument("--keep", type=Path, default=None, help="leave the root (after the run) in this folder")


@dataclass
class Report:
    deb_mb: float = 0.0
    tarball_mb: float = 0.0
    install_s: float = 0.0
    first_round_s: float = 0.0  # `sapo-node run --alone --rounds 1`, from the command to its end
    round_s: float = 0.0  # the round itself, as the node reports it (no start-up, no evaluation)
    steps: dict[str, str] = field(default_factory=dict)  # step -> "ok" or what went wrong

    @property
    def passed(self) -> bool:
        return bool(self.steps) and all(v == "ok" for v in self.steps.values())

    def line(self) -> str:
        goal = "met" if self.install_s and self.install_s <= INSTALL_GOAL_S else "missed"
        bad = [f"{k}: {v}" for k, v in self.steps.items() if v != "ok"]
        tar = f", tarball {self.tarball_mb:.0f} MB" if self.tarball_mb else ""
        return (
            f"package: .deb {self.deb_mb:.0f} MB{tar}, install {self.install_s:.0f} s (goal <= {INSTALL_GOAL_S:.0f} s: "
            f"{goal}), first round {self.first_round_s:.0f} s (the round itself {self.round_s:.0f} s), "
            + ("every step passed" if self.passed else "failed: " + "; ".join(bad))
        )


class Root:
    """A Debian root in a folder with /proc, /sys and /dev mounted; commands run in it by chroot."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounts: list[Path] = []

    def __enter__(self) -> Root:
        for what, where, opts in (
            ("proc", "proc", ["-t", "proc"]),
            ("/sys", "sys", ["--rbind"]),
            ("/dev", "dev", ["--rbind"]),
        ):
            target = self.path / where
            target.mkdir(exist_ok=True)
            subprocess.run(["mount", *opts, what, str(target)], check=True)
            self.mounts.append(target)
        (self.path / "tmp").chmod(0o1777)
        shutil.copyfile("/etc/resolv.conf", self.path / "etc" / "resolv.conf")  # apt's mirror
        return self

    def __exit__(self, *exc) -> None:
        for target in reversed(self.mounts):
            subprocess.run(["umount", "-R", "-l", str(target)], check=False)
        self.mounts.clear()

    def run(self, command: str, user: bool = False, timeout: float = 1800, env: dict[str, str] | None = None):
        """`sh -c command` in the root (as the volunteer where `user`), with a clean environment."""
        home = f"/home/{USER}" if user else "/root"
        values = {"HOME": home, "PATH": PATH, "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive", **(env or {})}
        who = ["--userspec", f"{UID}:{UID}"] if user else []
        cmd = ["chroot", *who, str(self.path), "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in values.items())]
        cmd += ["sh", "-c", f"cd {home} && {command}"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def base_root(suite: str, cache: Path) -> Path:
    """The minimal root as a tar, made once with mmdebstrap (a few minutes, Debian's mirror)."""
    tar = cache / f"debian-{suite}-apt.tar"
    if not tar.is_file():
        if shutil.which("mmdebstrap") is None:
            raise SystemExit("sapo-bench package: mmdebstrap is missing (apt install mmdebstrap)")
        cache.mkdir(parents=True, exist_ok=True)
        print(f"sapo-bench package: making a clean Debian {suite} root in {tar} (once)", flush=True)
        part = tar.with_name(tar.name + ".part.tar")
        subprocess.run(["mmdebstrap", "--quiet", "--variant=apt", suite, str(part)], check=True)
        part.replace(tar)
    return tar


def round_seconds(output: str, n: int) -> float:
    """The seconds `sapo-node run` printed at the end of its line for round n (0: not found)."""
    found = re.search(rf"^round\s+{n}\s.*?\s(\d+(?:\.\d+)?) s\s*$", output, re.MULTILINE | re.DOTALL)
    return float(found.group(1)) if found else 0.0  # the line may wrap: the first "N s" ending a line


def _no_compiler(root: Root) -> str:
    found = root.run(" || ".join(f"command -v {c}" for c in (*COMPILERS, "cpp")))
    return "ok" if found.returncode != 0 else f"the root has {found.stdout.strip()}"


def _tail(done: subprocess.CompletedProcess, lines: int = 3) -> str:
    text = ((done.stdout or "") + (done.stderr or "")).strip().splitlines()
    return " | ".join(text[-lines:]) or f"exit {done.returncode}"


def check_package(deb: Path, tarball: Path | None, base: Path, keep: Path | None = None) -> Report:
    """Steps 1-6 of the module's docstring in a fresh root from `base`; a Report of each."""
    report = Report(deb_mb=deb.stat().st_size / 1e6, tarball_mb=tarball.stat().st_size / 1e6 if tarball else 0.0)
    work = Path(tempfile.mkdtemp(prefix="sapo-bench-package-", dir=keep.parent if keep else None))
    path = work / "root"
    path.mkdir()
    try:
        subprocess.run(["tar", "-C", str(path), "-xf", str(base)], check=True)
        shutil.copyfile(deb, path / "tmp" / deb.name)
        with Root(path) as root:
            steps = report.steps
            steps["no compiler"] = _no_compiler(root)
            root.run(f"useradd --create-home --uid {UID} --shell /bin/sh {USER}")
            root.run("apt-get update -qq")
            start = time.monotonic()
            done = root.run(f"apt-get install -y -q /tmp/{deb.name}")
            report.install_s = time.monotonic() - start
            steps["install"] = "ok" if done.returncode == 0 else _tail(done)
            if done.returncode != 0:
                return report
            steps["no compiler after it"] = _no_compiler(root)  # nor did the package's dependencies bring one
            gone = root.run("for c in sapo-swarm sapo-node; do command -v $c >/dev/null || echo $c; done")
            steps["commands on PATH"] = "ok" if not gone.stdout.strip() else f"missing: {gone.stdout.split()}"
            menu = (path / "usr/share/applications/sapo-swarm.desktop").read_text()
            steps["menu entry"] = "ok" if "x-scheme-handler/sapo" in menu else "no sapo:// handler"
            done = root.run("sapo-node doctor", user=True, timeout=600)
            steps["doctor"] = "ok" if done.returncode == 0 else _tail(done, 6)
            start = time.monotonic()
            done = root.run("sapo-node run --alone --rounds 1", user=True, timeout=1800, env={"COLUMNS": "200"})
            report.first_round_s = time.monotonic() - start
            steps["first round"] = "ok" if done.returncode == 0 else _tail(done)
            report.round_s = round_seconds(done.stdout, 1)
            root.run("apt-get install -y -q --no-install-recommends xvfb xauth")
            done = root.run(
                "xvfb-run -a -s '-screen 0 1280x900x24' sapo-swarm --screenshots shots --demo && ls shots", user=True
            )
            shots = [n for n in done.stdout.split() if n.endswith(".png")]
            steps["window (xcb)"] = "ok" if done.returncode == 0 and shots else _tail(done, 6)
            done = root.run("xvfb-run -a sapo-node doctor --only display", user=True, timeout=300)
            opens = done.returncode == 0 and "Qt opens a window here (xcb)" in done.stdout
            steps["doctor on the display"] = "ok" if opens else _tail(done, 4)
            if tarball is not None:
                shutil.copyfile(tarball, path / "home" / USER / tarball.name)
                done = root.run(
                    f"mkdir -p elsewhere && tar -C elsewhere -xzf {tarball.name} && ./elsewhere/*/sapo-node --version",
                    user=True,
                )
                steps["tarball"] = "ok" if done.returncode == 0 and "sapo-node" in done.stdout else _tail(done)
                done = root.run(
                    "./elsewhere/*/install-user.sh && ~/.local/bin/sapo-node --version && "
                    "readlink ~/.local/share/sapo-swarm/app/current && ./elsewhere/*/install-user.sh --uninstall",
                    user=True,
                )
                ok = done.returncode == 0 and "versions/" in done.stdout and "sapo-node " in done.stdout
                steps["tarball, installed for the user"] = "ok" if ok else _tail(done)
            runs = path / "home" / USER / ".local" / "share" / "sapo-swarm"
            done = root.run("apt-get remove -y -q sapo-swarm")
            left = [p for p in ("opt/sapo-swarm", "usr/bin/sapo-node", "usr/bin/sapo-swarm") if (path / p).exists()]
            if done.returncode != 0 or left:
                steps["uninstall"] = _tail(done) if done.returncode else f"left {left}"
            else:
                steps["uninstall"] = "ok" if runs.is_dir() and any(runs.iterdir()) else "the user's data went too"
        return report
    finally:
        if _mounted_under(work):  # never delete through a bind mount of the host's /dev or /sys
            print(f"sapo-bench package: {work} still has mounts; left it (umount -R it, then remove it)", flush=True)
        else:
            if keep is not None:
                shutil.rmtree(keep, ignore_errors=True)
                path.rename(keep)
            shutil.rmtree(work, ignore_errors=True)


def _mounted_under(folder: Path) -> list[str]:
    prefix = str(folder.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SystemExit("sapo-bench package: needs root (it makes a Debian root and chroots into it)")
    for f in (args.deb, args.tarball):
        if f is not None and not f.is_file():
            raise SystemExit(f"sapo-bench package: {f} is not a file (installer/package.sh --out DIR writes it)")
    base = base_root(args.suite, args.cache or default_cache())
    report = check_package(args.deb.resolve(), args.tarball.resolve() if args.tarball else None, base, args.keep)
    for step, said in report.steps.items():
        print(f"  {step}: {said}", flush=True)
    print(report.line(), flush=True)
    return 0 if report.passed else 1
