"""Container images built from Debian packages and PyPI, never pulled.

Each image is described by a recipe under cluster/images/:
- the pod sandbox ("pause"): one static binary compiled from pause.c;
- the training image: a Debian root file system made with debootstrap plus the recipe's packages,
  and the few pure wheels Debian lacks (the recipe's "wheels"), installed by this machine's pip
  (which reaches PyPI here; the chroot's own would not) without dependencies: Debian provides those;
  and the source-only packages (the recipe's "sdists"), downloaded by this machine's pip and built inside
  the root file system against its own libraries;
- Airflow's images, to run Airflow inside the cluster as the official Helm chart does: PostgreSQL
  (postgres.json) and Airflow (airflow.json), whose Python packages are one constraints file's set, installed
  as wheels by this machine's uv ("python_packages"), with this repository's provider in a second layer of
  its own, rebuilt alone when the provider's source changes. `volcano-cluster up` builds only IMAGES;
  `python3 scripts/volcano_images.py build airflow` builds AIRFLOW_IMAGES.

Each image is written once as a docker-archive tar (manifest.json, config, its layers) into the cache,
named by a digest of its recipe, the files the recipe names and BUILDER_VERSION (plus the provider's source,
for the provider's layer), so it is rebuilt only when those change; `ctr images import` puts it into
containerd. Standard library only, like scripts/volcano-cluster.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "cluster" / "images"
# Part of every image's cache key: raise it when a change here changes what an image contains.
BUILDER_VERSION = "1"
PAUSE_REFERENCE = "localhost/airflow-volcano/pause:dev"
# volcano_cluster.IMAGE_CACHE, the same directory (that module imports this one, not the reverse).
IMAGE_CACHE = Path(
    os.environ.get("VOLCANO_CLUSTER_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-volcano"
) / "images"
# What the provider's wheel is built from (pyproject.toml's package find and package data, its readme and
# license): the provider layer's key.
PROVIDER_SOURCES = ("pyproject.toml", "README.md", "LICENSE", "airflow_volcano")

Log = Callable[[str], None]
Run = Callable[..., None]


@dataclass(frozen=True)
class Image:
    reference: str
    recipe: Path  # what the cache key is made of, with BUILDER_VERSION and `inputs`
    inputs: tuple[Path, ...] = ()  # the other files the recipe names (a constraints file, a script)
    provider_layer: bool = False  # this repository's wheel on top, in a layer of its own

    def key(self) -> str:
        digest = hashlib.sha256(BUILDER_VERSION.encode() + b"\0" + self.recipe.read_bytes())
        for path in self.inputs:
            digest.update(b"\0" + path.read_bytes())
        return digest.hexdigest()[:16]

    def archive(self, cache: Path) -> Path:
        if self.provider_layer:
            return cache / f"{self.recipe.stem}-{self.key()}-{provider_key()}.tar"
        return cache / f"{self.recipe.stem}-{self.key()}.tar"

    def base_layer(self, cache: Path) -> Path:
        """A provider-layered image's lower layer, kept beside its archive: a new provider reuses it."""
        return cache / f"{self.recipe.stem}-{self.key()}.base.tar"

    def base_files(self, cache: Path) -> set[Path]:
        """The base layer, its image config (written first, so a base layer implies it) and its build log."""
        base = self.base_layer(cache)
        return {base, base.with_suffix(".json"), base.with_suffix(".build.log")}


def recipe_image(recipe_name: str) -> Image:
    recipe_path = RECIPES / recipe_name
    recipe = json.loads(recipe_path.read_text())
    inputs = [RECIPES / source for source in recipe.get("scripts", {}).values()]
    if "requirements_file" in recipe.get("python_packages", {}):
        inputs.append(REPO / recipe["python_packages"]["requirements_file"])
    return Image(recipe["reference"], recipe_path, tuple(inputs), bool(recipe.get("provider_layer")))


PAUSE = Image(PAUSE_REFERENCE, RECIPES / "pause.c")
TRAINING = recipe_image("pytorch-cpu.json")
POSTGRES = recipe_image("postgres.json")
AIRFLOW = recipe_image("airflow.json")
# What `volcano-cluster up` builds and imports.
IMAGES = [PAUSE, TRAINING]
# Airflow in the cluster, as the official Helm chart runs it: built on demand (main()), never by `up`.
AIRFLOW_IMAGES = [POSTGRES, AIRFLOW]
IMAGE_SETS = {"cluster": IMAGES, "airflow": AIRFLOW_IMAGES}


def provider_source_files() -> list[Path]:
    files = []
    for name in PROVIDER_SOURCES:
        path = REPO / name
        if path.is_dir():
            files += [file for file in path.rglob("*") if file.is_file() and "__pycache__" not in file.parts]
        else:
            files.append(path)
    return sorted(files)


def provider_key() -> str:
    """A digest of the provider's source: its layer is rebuilt when this changes, the base layer is not."""
    digest = hashlib.sha256(BUILDER_VERSION.encode())
    for path in provider_source_files():
        content = path.read_bytes()
        digest.update(f"\0{path.relative_to(REPO)}\0{len(content)}\0".encode() + content)
    return digest.hexdigest()[:16]


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


def debian_security_mirror() -> str:
    """The Debian security mirror this machine's apt uses."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for stanza in sources.read_text().split("\n\n"):
            fields = {name: value for name, _, value in (line.partition(":") for line in stanza.splitlines())
                      if name[:1].isalpha()}  # not comments
            if "-security" in fields.get("Suites", "") and fields.get("URIs", "").split():
                return fields["URIs"].split()[0]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["deb"] and "security" in line:
                return next(part for part in parts[1:] if "://" in part)
    raise RuntimeError("no Debian security mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list")


def tar_layer(root: Path, out: Path, members: Sequence[str] = (".",)) -> None:
    """A layer tar of `members` (paths relative to `root`, "./..."): the whole tree unless told."""
    # GNU tar keeps owners, modes, device nodes and hard links as they are in the root file system.
    subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(out), *members], check=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_archive(layers: Path | Sequence[Path], reference: str, config: dict, out: Path) -> None:
    """A docker-archive tar of the layers, lowest first, as `ctr images import` reads. A layer is a
    directory (the whole tree, a root file system) or a layer tar made already."""
    layer_paths = [layers] if isinstance(layers, Path) else list(layers)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        layer_tars = []
        for index, layer in enumerate(layer_paths):
            if layer.is_dir():
                layer_tar = Path(scratch) / f"layer-{index}.tar"
                tar_layer(layer, layer_tar)
                layer = layer_tar
            layer_tars.append(layer)
        digests = [file_sha256(layer_tar) for layer_tar in layer_tars]
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}" for digest in digests]},
            "history": [{"created_by": "scripts/volcano_images.py"} for _ in digests],
        }
        config_bytes = json.dumps(image_config, sort_keys=True).encode()
        config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
        manifest = [{"Config": config_name, "RepoTags": [reference],
                     "Layers": [f"{digest}/layer.tar" for digest in digests]}]
        partial = out.with_suffix(".partial")
        with tarfile.open(partial, "w") as archive:
            for name, payload in ((config_name, config_bytes), ("manifest.json", json.dumps(manifest).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
            for layer_tar, digest in zip(layer_tars, digests, strict=True):
                archive.add(layer_tar, arcname=f"{digest}/layer.tar")
        partial.rename(out)


def build_pause(image: Image, out: Path, log: Log) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        rootfs = Path(scratch) / "rootfs"
        rootfs.mkdir()
        subprocess.run(["gcc", "-static", "-O2", "-o", str(rootfs / "pause"), str(image.recipe)], check=True)
        write_archive(rootfs, image.reference, {"Entrypoint": ["/pause"]}, out)


def command_runner(sink: TextIO, build_log: Path, reference: str, env: dict[str, str] | None = None) -> Run:
    """Runs a command with its output into the build log; a failure raises with the log's tail."""
    def run(*cmd: str) -> None:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        if subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env).returncode != 0:
            tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"building {reference} failed at `{' '.join(cmd[:3])} ...`; log: {build_log}\n{tail}")
    return run


def build_debian(image: Image, out: Path, log: Log) -> None:
    """An image of one layer: the recipe's Debian root file system."""
    recipe = json.loads(image.recipe.read_text())
    work = out.parent / f"{out.stem}.rootfs"
    make_rootfs(image, recipe, work, out.with_suffix(".build.log"), log)
    write_archive(work, image.reference, image_config(recipe, work), out)
    shutil.rmtree(work)


def build_with_provider(image: Image, out: Path, log: Log) -> None:
    """Two layers: the recipe's root file system (cached by the recipe's key) and the provider's wheel."""
    recipe = json.loads(image.recipe.read_text())
    base = image.base_layer(out.parent)
    if base.exists():
        log(f"    base layer cached ({base.name}): building the provider's layer only")
    else:
        started = time.monotonic()
        work = out.parent / f"{base.stem}.rootfs"
        make_rootfs(image, recipe, work, base.with_suffix(".build.log"), log)
        base.with_suffix(".json").write_text(json.dumps(image_config(recipe, work), indent=2))
        partial = base.with_suffix(".partial")
        tar_layer(work, partial)
        partial.rename(base)
        shutil.rmtree(work)
        log(f"    base layer built in {time.monotonic() - started:.0f}s ({base.stat().st_size / 2**20:.0f} MiB)")
    packages = recipe["python_packages"]
    build_log = out.with_suffix(".build.log")
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch, build_log.open("w") as sink:
        provider = Path(scratch) / "provider.tar"
        build_provider_layer(packages["python"], packages["platform"], provider,
                             command_runner(sink, build_log, image.reference))
        write_archive([base, provider], image.reference, json.loads(base.with_suffix(".json").read_text()), out)


def make_rootfs(image: Image, recipe: dict, work: Path, build_log: Path, log: Log) -> None:
    mirror = debian_mirror()
    unmount_proc(work)
    shutil.rmtree(work, ignore_errors=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LANG="C.UTF-8")
    with build_log.open("w") as sink:
        run = command_runner(sink, build_log, image.reference, env)
        started = time.monotonic()
        run("debootstrap", "--variant=minbase", recipe["suite"], str(work), mirror)
        log(f"    debootstrap {recipe['suite']}: {time.monotonic() - started:.0f}s")
        if recipe.get("security_updates"):
            # debootstrap's sources hold the release only; a server image wants its security fixes.
            with (work / "etc" / "apt" / "sources.list").open("a") as sources:
                sources.write(f"deb {mirror} {recipe['suite']}-updates main\n"
                              f"deb {debian_security_mirror()} {recipe['suite']}-security main\n")
            run("chroot", str(work), "apt-get", "update", "-q")
            run("chroot", str(work), "apt-get", "upgrade", "-y", "-q")
        for command in recipe.get("prepare", []):
            run("chroot", str(work), "/bin/sh", "-ec", command)
        run("chroot", str(work), "apt-get", "install", "-y", "-q", "--no-install-recommends", *recipe["packages"])
        if recipe.get("wheels"):
            (python,) = {path.name for path in (work / "usr" / "lib").glob("python3.*") if path.name[8:].isdigit()}
            run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                "--platform=manylinux2014_x86_64", f"--python-version={python[6:]}",
                f"--target={work}/usr/local/lib/{python}/dist-packages", *recipe["wheels"])
        if recipe.get("python_packages"):
            install_python_packages(work, recipe["python_packages"], run)
        for target, source in recipe.get("scripts", {}).items():
            script = work / target.lstrip("/")
            shutil.copyfile(RECIPES / source, script)
            script.chmod(0o755)
        # Builds and checks that ask psutil or torch about this process need /proc.
        subprocess.run(["mount", "-t", "proc", "proc", str(work / "proc")], check=True)
        try:
            build_inside(work, recipe, run)
        finally:
            unmount_proc(work)
        run("chroot", str(work), "apt-get", "clean")
    shutil.rmtree(work / "var" / "lib" / "apt" / "lists", ignore_errors=True)
    (work / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True)


def image_config(recipe: dict, rootfs: Path) -> dict:
    config: dict = {"Env": [f"{key}={value}" for key, value in recipe["env"].items()]}
    for field, name in (("entrypoint", "Entrypoint"), ("cmd", "Cmd"), ("workdir", "WorkingDir"),
                        ("stop_signal", "StopSignal")):
        if field in recipe:
            config[name] = recipe[field]
    if "user" in recipe:
        # By number: the kubelet can tell a numeric user is not root (runAsNonRoot) without the image's passwd.
        config["User"] = str(user_id(rootfs, recipe["user"]))
    return config


def user_id(rootfs: Path, name: str) -> int:
    for line in (rootfs / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2])
    raise RuntimeError(f"no user {name} in {rootfs}/etc/passwd")


def uv() -> Path:
    """This machine's uv (`make venv` puts it into .venv): it reaches PyPI and has a warm cache."""
    for candidate in (REPO / ".venv" / "bin" / "uv", shutil.which("uv")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise RuntimeError("no uv: `make venv` installs it into .venv")


def install_wheels(root: Path, python: str, platform: str, requirements: Sequence[str], run: Run) -> None:
    """Wheels only, installed by this machine's uv into `root`'s /usr/local (the chroot's Python cannot
    reach PyPI), compiled to bytecode (the image's users cannot write it beside root's files); their
    commands into /usr/local/bin, run by the image's own Python."""
    site = root / "usr" / "local" / "lib" / f"python{python}" / "dist-packages"
    # A host interpreter of the image's Python version compiles the bytecode; copies, not links into uv's cache.
    run(str(uv()), "pip", "install", "-q", "--no-python-downloads", "--python", python, "--target", str(site),
        "--python-version", python, "--python-platform", platform, "--only-binary", ":all:",
        "--link-mode", "copy", "--compile-bytecode", *requirements)
    (site / ".lock").unlink(missing_ok=True)  # uv's, world-writable
    commands = site / "bin"
    if commands.is_dir():
        bin_dir = root / "usr" / "local" / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for command in sorted(commands.iterdir()):
            first_line, _, rest = command.read_bytes().partition(b"\n")
            if not (first_line.startswith(b"#!") and b"python" in first_line):
                raise RuntimeError(f"{command.name}: not a Python console script ({first_line[:80]!r})")
            # uv wrote this machine's interpreter.
            (bin_dir / command.name).write_bytes(f"#!/usr/bin/python{python}\n".encode() + rest)
            (bin_dir / command.name).chmod(0o755)
        shutil.rmtree(commands)


def install_python_packages(work: Path, packages: dict, run: Run) -> None:
    python = packages["python"]
    if not (work / "usr" / "lib" / f"python{python}").is_dir():
        raise RuntimeError(f"the recipe's Python is {python}; the root file system has no /usr/lib/python{python}")
    requirements = [*(["-r", str(REPO / packages["requirements_file"])] if "requirements_file" in packages else []),
                    *packages.get("requirements", [])]
    install_wheels(work, python, packages["platform"], requirements, run)


def build_provider_wheel(scratch: Path, run: Run) -> Path:
    # From a copy: setuptools writes build/ and *.egg-info into the tree it builds.
    source, out = scratch / "source", scratch / "wheel"
    for name in PROVIDER_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    run(str(uv()), "build", "-q", "--wheel", "-o", str(out), str(source))
    (wheel,) = out.glob("airflow_volcano-*.whl")
    return wheel


def build_provider_layer(python: str, platform: str, out: Path, run: Run) -> None:
    """A layer of the provider's files only: its wheel, installed without dependencies into the site
    directory the base layer's packages are in, as a user adds a provider to the official image."""
    with tempfile.TemporaryDirectory() as scratch:
        wheel = build_provider_wheel(Path(scratch), run)
        root = Path(scratch) / "root"
        install_wheels(root, python, platform, ["--no-deps", str(wheel)], run)
        site = root / "usr" / "local" / "lib" / f"python{python}" / "dist-packages"
        installed = [*site.iterdir(), *(root / "usr" / "local" / "bin").glob("*")]
        # Not their parent directories: the base layer has them, with its own owners and modes.
        tar_layer(root, out, [f"./{path.relative_to(root)}" for path in sorted(installed)])


def unmount_proc(rootfs: Path) -> None:
    if (rootfs / "proc" / "self").exists():
        subprocess.run(["umount", "-l", str(rootfs / "proc")], check=False)


def build_inside(work: Path, recipe: dict, run: Run) -> None:
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


BUILDERS: dict[Image, Callable[[Image, Path, Log], None]] = {
    PAUSE: build_pause, TRAINING: build_debian, POSTGRES: build_debian, AIRFLOW: build_with_provider}


def ensure_archives(cache: Path, log: Log, images: Sequence[Image] = IMAGES) -> dict[Image, Path]:
    """Build the images whose recipe (or provider) changed; return each image's archive."""
    cache.mkdir(parents=True, exist_ok=True)
    archives = {}
    for image in images:
        archive = image.archive(cache)
        if not archive.exists():
            started = time.monotonic()
            log(f"  building image {image.reference} (recipe {image.recipe.name}, key {image.key()}) ...")
            # A provider-layered image's base layer outlives a change of the provider alone.
            keep = image.base_files(cache) if image.provider_layer and image.base_layer(cache).exists() else set()
            for stale in cache.glob(f"{image.recipe.stem}-*"):  # older keys, and any interrupted build
                if stale in keep:
                    continue
                if stale.is_dir():
                    unmount_proc(stale)
                    shutil.rmtree(stale)
                else:
                    stale.unlink()
            BUILDERS[image](image, archive, log)
            log(f"  image {image.reference} built in {time.monotonic() - started:.0f}s "
                f"({archive.stat().st_size / 2**20:.0f} MiB)")
        archives[image] = archive
    return archives


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="volcano_images.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help=f"build a set of images into {IMAGE_CACHE} (as root: debootstrap)"
                                              "; print each archive's path")
    build.add_argument("images", choices=sorted(IMAGE_SETS))
    arguments = parser.parse_args(argv)
    archives = ensure_archives(IMAGE_CACHE, lambda line: print(line, file=sys.stderr, flush=True),
                               IMAGE_SETS[arguments.images])
    for archive in archives.values():
        print(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
