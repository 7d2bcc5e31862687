"""The local cluster's image archives (scripts/volcano_images.py): what `ctr images import` reads."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import volcano_images  # scripts/, on pytest's pythonpath


def test_archive_is_a_docker_archive_whose_diff_id_is_the_layers_digest(tmp_path):
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "bin" / "tool").write_text("#!/bin/sh\necho hi\n")
    (rootfs / "bin" / "tool").chmod(0o755)
    out = tmp_path / "image.tar"

    volcano_images.write_archive(rootfs, "localhost/test/tool:dev", {"Cmd": ["/bin/tool"]}, out)

    with tarfile.open(out) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == ["localhost/test/tool:dev"]
        config = json.load(archive.extractfile(manifest[0]["Config"]))
        layer = archive.extractfile(manifest[0]["Layers"][0]).read()
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"]
    assert (config["os"], config["architecture"], config["config"]["Cmd"]) == ("linux", "amd64", ["/bin/tool"])
    with tarfile.open(fileobj=io.BytesIO(layer)) as files:
        tool = files.getmember("./bin/tool")
        assert tool.mode & 0o777 == 0o755 and files.extractfile(tool).read() == b"#!/bin/sh\necho hi\n"
    assert not list(tmp_path.glob("*.partial")), "the archive appears whole or not at all"


def test_cache_key_follows_the_recipe(tmp_path):
    recipe = tmp_path / "image.json"
    recipe.write_text('{"packages": ["python3"]}')
    image = volcano_images.Image("localhost/test/x:dev", recipe)
    before = image.key()
    assert image.key() == before
    recipe.write_text('{"packages": ["python3", "python3-torch"]}')
    assert image.key() != before
    assert image.archive(tmp_path).name == f"image-{image.key()}.tar"


def test_debian_mirror_is_read_from_apts_own_sources():
    mirror = volcano_images.debian_mirror()
    assert mirror.startswith(("http://", "https://")) and "debian" in mirror


def test_a_recipes_other_files_are_part_of_its_key_and_a_recipe_alone_keeps_its_key(tmp_path):
    recipe, constraints = tmp_path / "image.json", tmp_path / "constraints.txt"
    recipe.write_text('{"packages": ["python3"]}')
    constraints.write_text("apache-airflow==3.3.2\n")
    alone, with_constraints = volcano_images.Image("r", recipe), volcano_images.Image("r", recipe, (constraints,))
    # The cluster's images (no other files) keep the keys their cached archives are named by.
    expected = hashlib.sha256(volcano_images.BUILDER_VERSION.encode() + b"\0" + recipe.read_bytes()).hexdigest()
    assert alone.key() == expected[:16]
    before = with_constraints.key()
    constraints.write_text("apache-airflow==3.3.1\n")
    assert with_constraints.key() != before and alone.key() == expected[:16]


def test_volcano_cluster_up_builds_only_the_clusters_own_images():
    assert volcano_images.IMAGES == [volcano_images.PAUSE, volcano_images.TRAINING]
    assert not set(volcano_images.AIRFLOW_IMAGES) & set(volcano_images.IMAGES)
    assert volcano_images.AIRFLOW.provider_layer and not volcano_images.POSTGRES.provider_layer
    assert volcano_images.REPO / "constraints-airflow-3.3.txt" in volcano_images.AIRFLOW.inputs
    assert volcano_images.RECIPES / "postgres-entrypoint.sh" in volcano_images.POSTGRES.inputs


def test_the_image_cache_is_volcano_clusters(tmp_path):
    read = "import volcano_cluster, volcano_images; print(volcano_cluster.IMAGE_CACHE == volcano_images.IMAGE_CACHE)"
    for settings in ({}, {"VOLCANO_CLUSTER_CACHE": str(tmp_path)}, {"XDG_CACHE_HOME": str(tmp_path)}):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("VOLCANO_CLUSTER_")}, **settings}
        out = subprocess.run([sys.executable, "-c", read], env=env, cwd=volcano_images.REPO / "scripts",
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "True", settings


def provider_sources(root: Path) -> None:
    (root / "airflow_volcano" / "__pycache__").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "airflow_volcano/__init__.py"):
        (root / name).write_text(f"{name}\n")


def test_the_provider_layers_key_follows_the_providers_source_only(tmp_path, monkeypatch):
    provider_sources(tmp_path)
    monkeypatch.setattr(volcano_images, "REPO", tmp_path)
    recipe = tmp_path / "airflow.json"
    recipe.write_text("{}")
    image = volcano_images.Image("r", recipe, provider_layer=True)
    base_key, before = image.key(), image.archive(tmp_path).name
    (tmp_path / "airflow_volcano" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"bytecode")
    assert image.archive(tmp_path).name == before, "bytecode is not source"
    (tmp_path / "airflow_volcano" / "__init__.py").write_text("changed\n")
    after = image.archive(tmp_path).name
    assert after != before and image.key() == base_key
    assert before.startswith(f"airflow-{base_key}-") and after.startswith(f"airflow-{base_key}-")


def test_a_new_provider_rebuilds_the_archive_keeping_the_base_layer(tmp_path, monkeypatch):
    provider_sources(tmp_path)
    monkeypatch.setattr(volcano_images, "REPO", tmp_path)
    recipe, cache = tmp_path / "airflow.json", tmp_path / "cache"
    recipe.write_text("{}")
    cache.mkdir()
    image = volcano_images.Image("r", recipe, provider_layer=True)
    for kept in image.base_files(cache):
        kept.write_text("base")
    older = [cache / f"airflow-{image.key()}-0000000000000000.tar", cache / "airflow-0000000000000000.base.tar",
             cache / "airflow-0000000000000000.base.rootfs"]
    older[0].write_text("archive of an older provider")
    older[1].write_text("base of an older recipe")
    older[2].mkdir()
    built = []
    monkeypatch.setitem(volcano_images.BUILDERS, image, lambda image, out, log: built.append(out) or out.touch())

    volcano_images.ensure_archives(cache, lambda line: None, [image])
    volcano_images.ensure_archives(cache, lambda line: None, [image])

    assert built == [image.archive(cache)], "built once, then cached"
    assert set(cache.iterdir()) == image.base_files(cache) | {image.archive(cache)}


def test_a_two_layer_archive_holds_the_base_and_then_the_providers_files_only(tmp_path):
    base = tmp_path / "rootfs"
    (base / "usr" / "local" / "lib" / "python3.11" / "dist-packages").mkdir(parents=True)
    (base / "etc").mkdir()
    (base / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    provider = tmp_path / "provider.tar"
    with (tmp_path / "build.log").open("w") as sink:
        run = volcano_images.command_runner(sink, tmp_path / "build.log", "localhost/test/airflow:dev")
        volcano_images.build_provider_layer("3.11", "x86_64-manylinux_2_36", provider, run)
    out = tmp_path / "image.tar"

    volcano_images.write_archive([base, provider], "localhost/test/airflow:dev", {"Cmd": ["airflow"]}, out)

    with tarfile.open(out) as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))
        config = json.load(archive.extractfile(manifest["Config"]))
        layers = [archive.extractfile(name).read() for name in manifest["Layers"]]
    digests = [hashlib.sha256(layer).hexdigest() for layer in layers]
    assert layers[1] == provider.read_bytes(), "the base first, the provider's layer second"
    assert manifest["Layers"] == [f"{digest}/layer.tar" for digest in digests]
    assert config["rootfs"]["diff_ids"] == [f"sha256:{digest}" for digest in digests]
    assert len(config["history"]) == 2
    with tarfile.open(fileobj=io.BytesIO(layers[0])) as files:
        assert "./etc/passwd" in files.getnames()
    with tarfile.open(fileobj=io.BytesIO(layers[1])) as files:
        names = files.getnames()
    site = "./usr/local/lib/python3.11/dist-packages/"
    version = tomllib.loads((volcano_images.REPO / "pyproject.toml").read_text())["project"]["version"]
    provider_dirs = (f"{site}airflow_volcano", f"{site}airflow_volcano-{version}.dist-info")
    assert all(name.startswith(provider_dirs) for name in names), [n for n in names if not n.startswith(provider_dirs)]
    assert f"{site}airflow_volcano/get_provider_info.py" in names
    assert f"{site}airflow_volcano-{version}.dist-info/entry_points.txt" in names
    assert any(name.endswith(".cpython-311.pyc") for name in names), "compiled: the image's users cannot write it"
