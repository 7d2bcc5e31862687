"""Container images for the local cluster's real node, built from Debian packages, never pulled.

Two images, each described by a recipe under cluster/images/:
- the pod sandbox ("pause"): one static binary compiled from pause.c;
- the training image: a Debian root file system made with debootstrap plus the recipe's packages,
  and the few pure wheels Debian lacks (the recipe's "wheels"), installed by this machine's pip
  (which reaches PyPI here; the chroot's own would not) without dependencies: Debian provides those;
  and the source-only packages (the recipe's "sdists"), downloaded by this machine's pip and built inside
  the root file system against its own libraries.

Each image is written once as a docker-archive tar (manifest.json, config, one layer) into the
cache, named by a digest of its recipe (and BUILDER_VERSION), so it is rebuilt only when that changes;
`ctr images import` puts it into containerd. Standard library only, like scripts/volcano-cluster.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RECIPES = Path(__file__).resolve().parent.parent / "cluster" / "images"
# Part of every image's cache key: raise it when a change here changes what an image contains.
BUILDER_VERSION = "1"
PAUSE_REFERENCE = "localhost/airflow-volcano/pause:dev"


@dataclass(frozen=True)
class Image:
    reference: str
    recipe: Path  # what the cache key is made of, with BUILDER_VERSION

    def key(self) -> str:
        return hashlib.sha256(BUILDER_VERSION.encode() + b"\0" + self.recipe.read_bytes()).hexdigest()[:16]

    def archive(self, cache: Path) -> Path:
        return cache / f"{self.recipe.stem}-{self.key()}.tar"


PAUSE = Image(PAUSE_REFERENCE, RECIPES / "pause.c")
TRAINING = Image(json.loads((RECIPES / "pytorch-cpu.json").read_text())["reference"], RECIPES / "pytorch-cpu.json")
IMAGES = [PAUSE, TRAINING]


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (the only one reachable here)."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["deb"] and "security" not in line:
                return next(part for part in parts[1:] if "://" in part)
    raise RuntimeError("no Debian mirror found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list")


def write_archive(rootfs: Path, reference: str, config: dict, out: Path) -> None:
    """A docker-archive tar of one layer (the whole root file system), as `ctr images import` reads."""
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        layer = Path(scratch) / "layer.tar"
        # GNU tar keeps owners, modes, device nodes and hard links as they are in the root file system.
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(layer), "."], check=True)
        digest = hashlib.sha256()
        with layer.open("rb") as data:
            while chunk := data.read(1 << 20):
                digest.update(chunk)
        diff_id = f"sha256:{digest.hexdigest()}"
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "scripts/volcano_images.py"}],
        }
        config_bytes = json.dumps(image_config, sort_keys=True).encode()
        config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
        manifest = [{"Config": config_name, "RepoTags": [reference], "Layers": [f"{digest.hexdigest()}/layer.tar"]}]
        partial = out.with_suffix(".partial")
        with tarfile.open(partial, "w") as archive:
            for name, payload in ((config_name, config_bytes), ("manifest.json", json.dumps(manifest).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
            archive.add(layer, arcname=f"{digest.hexdigest()}/layer.tar")
        partial.rename(out)


def build_pause(out: Path, log: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        rootfs = Path(scratch) / "rootfs"
        rootfs.mkdir()
        subprocess.run(["gcc", "-static", "-O2", "-o", str(rootfs / "pause"), str(PAUSE.recipe)], check=True)
        write_archive(rootfs, PAUSE.reference, {"Entrypoint": ["/pause"]}, out)


def build_training(out: Path, log: Callable[[str], None]) -> None:
    recipe = json.loads(TRAINING.recipe.read_text())
    mirror = debian_mirror()
    work = out.parent / f"{out.stem}.rootfs"
    unmount_proc(work)
    shutil.rmtree(work, ignore_errors=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LANG="C.UTF-8")
    build_log = out.with_suffix(".build.log")
    with build_log.open("w") as sink:
        def run(*cmd: str) -> None:
            sink.write(f"$ {' '.join(cmd)}\n")
            sink.flush()
            if subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env).returncode != 0:
                tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(f"building {TRAINING.reference} failed at `{' '.join(cmd[:3])} ...`; "
                                   f"log: {build_log}\n{tail}")

        started = time.monotonic()
        run("debootstrap", "--variant=minbase", recipe["suite"], str(work), mirror)
        log(f"    debootstrap {recipe['suite']}: {time.monotonic() - started:.0f}s")
        run("chroot", str(work), "apt-get", "install", "-y", "-q", "--no-install-recommends", *recipe["packages"])
        if recipe.get("wheels"):
            (python,) = {path.name for path in (work / "usr" / "lib").glob("python3.*") if path.name[8:].isdigit()}
            run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                "--platform=manylinux2014_x86_64", f"--python-version={python[6:]}",
                f"--target={work}/usr/local/lib/{python}/dist-packages", *recipe["wheels"])
        # Builds and checks that ask psutil or torch about this process need /proc.
        subprocess.run(["mount", "-t", "proc", "proc", str(work / "proc")], check=True)
        try:
            build_inside(work, recipe, run)
        finally:
            unmount_proc(work)
        run("chroot", str(work), "apt-get", "clean")
    shutil.rmtree(work / "var" / "lib" / "apt" / "lists", ignore_errors=True)
    (work / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True)
    config = {"Env": [f"{key}={value}" for key, value in recipe["env"].items()], "Cmd": recipe["cmd"]}
    write_archive(work, TRAINING.reference, config, out)
    shutil.rmtree(work)


def unmount_proc(rootfs: Path) -> None:
    if (rootfs / "proc" / "self").exists():
        subprocess.run(["umount", "-l", str(rootfs / "proc")], check=False)


def build_inside(work: Path, recipe: dict, run: Callable[..., None]) -> None:
    """The recipe's sdists, then its "run" commands, in the root file system."""
    if recipe.get("sdists"):
        # Built inside the image, against its own torch; the chroot cannot reach PyPI, so this machine's
        # pip downloads the source archives first.
        run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
            f"--dest={work}/tmp/sdists", *recipe["sdists"])
        build_env = [f"{key}={value}" for key, value in recipe.get("sdist_env", {}).items()]
        run("chroot", str(work), "/bin/sh", "-ec",
            f"env {' '.join(build_env)} python3 -m pip install -q --no-index --no-deps --no-build-isolation "
            "--break-system-packages /tmp/sdists/*; rm -rf /tmp/sdists /root/.cache/pip")
    for command in recipe.get("run", []):
        run("chroot", str(work), "/bin/sh", "-ec", command)


BUILDERS = {PAUSE: build_pause, TRAINING: build_training}


def ensure_archives(cache: Path, log: Callable[[str], None]) -> dict[Image, Path]:
    """Build the images whose recipe changed; return each image's archive."""
    cache.mkdir(parents=True, exist_ok=True)
    archives = {}
    for image in IMAGES:
        archive = image.archive(cache)
        if not archive.exists():
            started = time.monotonic()
            log(f"  building image {image.reference} (recipe {image.recipe.name}, key {image.key()}) ...")
            for stale in cache.glob(f"{image.recipe.stem}-*"):  # older keys, and any interrupted build
                if stale.is_dir():
                    unmount_proc(stale)
                    shutil.rmtree(stale)
                else:
                    stale.unlink()
            BUILDERS[image](archive, log)
            log(f"  image {image.reference} built in {time.monotonic() - started:.0f}s "
                f"({archive.stat().st_size / 2**20:.0f} MiB)")
        archives[image] = archive
    return archives
