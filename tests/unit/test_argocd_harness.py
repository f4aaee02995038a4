"""The Argo CD harness's static parts: which programs `make tools` builds from which release, and
the shipped Application and ApplicationSet that tests/e2e/test_argocd.py runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from apportion_dev.devcluster.tools import (
    ARGOCD,
    ARGOCD_LUA,
    ARGOCD_TOOLS,
    HELM,
    KUSTOMIZE,
    TEST_TOOLS,
    tool_build,
)

SHIPPED = Path(__file__).resolve().parents[2] / "manifests" / "argocd"
FINALIZER = "resources-finalizer.argocd.argoproj.io/foreground"


def test_argocd_and_argocd_lua_are_one_release_built_by_make_tools() -> None:
    assert {ARGOCD, ARGOCD_LUA, KUSTOMIZE} <= set(TEST_TOOLS)
    assert ARGOCD_TOOLS == (ARGOCD, KUSTOMIZE, HELM)
    argocd, lua = tool_build(ARGOCD), tool_build(ARGOCD_LUA)
    assert argocd.module == lua.module
    assert argocd.stamp["argocd"] == lua.stamp["argocd-lua"] == "v3.2.11"
    assert argocd.targets == ("github.com/argoproj/argo-cd/v3/cmd",)
    assert argocd.binaries == ("argocd",)
    assert lua.targets == ("apportion.dev/argocd/argocd-lua",)
    assert "argocd-lua/main.go" in lua.stamp["sources"]  # type: ignore[operator]
    assert argocd.ldflags("2026-01-01T00:00:00Z") == [
        "-X github.com/argoproj/argo-cd/v3/common.version=3.2.11",
        "-X github.com/argoproj/argo-cd/v3/common.buildDate=2026-01-01T00:00:00Z",
    ]
    # argo-cd's replaces, repeated: without them its Kubernetes libraries do not resolve
    assert "k8s.io/api => k8s.io/api v0.34.0" in (argocd.module / "go.mod").read_text()


def test_kustomize_is_the_version_argo_cd_ships() -> None:
    # hack/tool-versions.sh of argo-cd v3.2.11: kustomize5_version=5.7.0
    assert tool_build(KUSTOMIZE).stamp["kustomize"] == "v5.7.0"


def test_the_shipped_application_syncs_automatically_with_nothing_ignored() -> None:
    app = yaml.safe_load((SHIPPED / "application.yaml").read_text())
    assert app["metadata"]["namespace"] == "argocd"
    assert app["metadata"]["finalizers"] == [FINALIZER]
    assert app["spec"]["syncPolicy"]["automated"] == {"prune": True, "selfHeal": True}
    assert "ignoreDifferences" not in app["spec"]


def test_the_shipped_applicationset_makes_applications_like_the_shipped_one() -> None:
    appset = yaml.safe_load((SHIPPED / "applicationset.yaml").read_text())
    app = yaml.safe_load((SHIPPED / "application.yaml").read_text())
    template = appset["spec"]["template"]["spec"]
    assert template["syncPolicy"] == app["spec"]["syncPolicy"]
    assert "ignoreDifferences" not in template
    # the controller gives generated Applications the resources finalizer unless told not to
    assert "preserveResourcesOnDeletion" not in appset["spec"].get("syncPolicy", {})
    source = appset["spec"]["generators"][0]["git"]["repoURL"]
    assert template["source"]["repoURL"] == source


def test_the_shipped_operator_application_installs_the_released_chart_and_keeps_the_crds() -> None:
    app = yaml.safe_load((SHIPPED / "operator.yaml").read_text())
    source = app["spec"]["source"]
    assert source["repoURL"] == "oci://ghcr.io/apportion/charts/apportion"
    assert source["path"] == "."
    assert source["helm"]["releaseName"] == app["metadata"]["name"] == "apportion"
    assert app["spec"]["destination"]["namespace"] == "apportion-system"
    assert app["metadata"]["finalizers"] == [FINALIZER]
    assert "CreateNamespace=true" in app["spec"]["syncPolicy"]["syncOptions"]
    assert "ignoreDifferences" not in app["spec"]
    assert "skipCrds" not in source["helm"]


def test_the_sets_application_retries_while_the_crds_are_missing() -> None:
    app = yaml.safe_load((SHIPPED / "application.yaml").read_text())
    retry = app["spec"]["syncPolicy"]["retry"]
    assert retry["limit"] > 0
    assert retry["backoff"]["maxDuration"]
