"""The local cluster's image archives (scripts/volcano_images.py): what `ctr images import` reads."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

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
