"""Which Kubernetes release a devcluster builds, and that each wrapper module pins exactly it."""

from __future__ import annotations

import re

import pytest

from devcluster.errors import DevclusterError
from devcluster.versions import (
    DEFAULT_VERSION,
    RELEASES,
    SAME_SOURCE,
    UNBUILDABLE,
    Release,
    resolve,
)


@pytest.mark.parametrize("spec", ["1.33", "v1.33", "v1.33.13", "1.33.13", " 1.33 "])
def test_a_minor_or_its_pinned_release_names_the_same_release(spec: str) -> None:
    assert resolve(spec) == Release("v1.33.13")


def test_oldest_is_the_oldest_buildable_minor() -> None:
    assert resolve("oldest") == Release(RELEASES[min(RELEASES)]) == Release("v1.31.9")
    assert all(min(RELEASES) > minor for minor in UNBUILDABLE)


def test_no_version_is_the_default_release_built_from_the_harness_module() -> None:
    release = resolve(None)
    assert release.tag == DEFAULT_VERSION
    assert release.is_default
    assert release.gomod.name == "gomod"


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("v1.31.14", "not the pinned 1.31 release"),
        ("v1.32.13", "not the pinned 1.32 release"),
        ("1.30", "not supported"),
        ("1.38", "not supported"),
        ("v1.33.6", "not the pinned 1.33 release"),
        ("latest", "not a Kubernetes version"),
    ],
)
def test_a_release_that_cannot_be_built_is_refused_with_the_reason(spec: str, reason: str) -> None:
    with pytest.raises(DevclusterError, match=reason):
        resolve(spec)


def test_the_ldflags_stamp_the_release_it_reports() -> None:
    flags = Release("v1.35.4").ldflags()
    assert "-X k8s.io/component-base/version.gitVersion=v1.35.4" in flags
    assert "-X k8s.io/component-base/version.gitMinor=35" in flags


@pytest.mark.parametrize("minor", sorted(RELEASES))
def test_each_wrapper_module_pins_its_release_and_every_staging_module_to_match(
    minor: int,
) -> None:
    release = Release(RELEASES[minor])
    go_mod = (release.gomod / "go.mod").read_text()
    assert (release.gomod / "go.sum").is_file()
    assert re.search(
        rf"^\s*(require\s+)?k8s\.io/kubernetes {re.escape(release.tag)}\b", go_mod, re.M
    )
    staging = re.findall(r"^\s*(k8s\.io/[\w-]+) => (k8s\.io/[\w-]+) (v\S+)$", go_mod, re.M)
    assert len(staging) >= 20, "the staging modules are replaced by their published versions"
    patch = release.tag.split(".", 2)[2]
    want = f"v0.{minor}.{patch}"
    stand_ins = SAME_SOURCE.get(minor, {})
    for old, new, version in staging:
        assert old == new
        assert version == stand_ins.get(old, want), (old, version)
    assert set(stand_ins) <= {old for old, _, _ in staging}


def test_a_stand_in_module_is_another_patch_of_the_same_minor() -> None:
    for minor, modules in SAME_SOURCE.items():
        assert minor in RELEASES
        for module, version in modules.items():
            assert module.startswith("k8s.io/")
            assert re.fullmatch(rf"v0\.{minor}\.\d+", version), (module, version)
            assert version != f"v0.{minor}.{RELEASES[minor].split('.', 2)[2]}"


def test_no_minor_is_both_buildable_and_refused() -> None:
    assert not set(RELEASES) & set(UNBUILDABLE)


@pytest.mark.parametrize(
    ("version", "listing"),
    [
        ("v1.31.9", "all"),
        ("v1.32.9", "all"),
        ("v1.33.13", "all"),
        ("v1.34.4", "active"),
        ("v1.37.2", "active"),
        (None, "active"),
    ],
)
def test_simulated_kubelets_list_pods_as_kubelet_of_the_clusters_release(
    version: str | None, listing: str
) -> None:
    from devcluster.gpunodes import listing_of

    assert listing_of(version) == listing
