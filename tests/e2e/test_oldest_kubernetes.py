"""The oldest Kubernetes we support (README, "Supported Kubernetes versions"; the wrapper module
devtools/go/controlplane-oldest): the same tests of the CRDs, the worker policy and a set's
convergence as on the dev-cluster's own version, on a dev-cluster of that version with the pod
simulator. Importing them here collects them again, with this module's `dev_cluster`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.tools import OLDEST_KUBERNETES, ensure_tool
from tests.e2e.conftest import install_crds
from tests.e2e.test_crds import (
    test_invalid_specs_are_rejected_with_a_clear_message,
    test_key_mapping_fields_are_immutable,
    test_the_crds_take_a_server_side_apply_as_gitops_engines_make,
    test_valid_objects_are_accepted_and_defaulted,
)
from tests.e2e.test_partitionset import (
    demo,
    test_placed_evenly_then_scaled_out_with_the_fewest_acknowledged_moves,
)
from tests.e2e.test_worker_policy import (
    test_a_token_not_bound_to_a_pod_writes_nothing,
    test_a_worker_is_refused,
    test_a_worker_writes_its_own_ack_and_its_unit_state,
    world,
)

__all__ = [
    "demo",
    "test_a_token_not_bound_to_a_pod_writes_nothing",
    "test_a_worker_is_refused",
    "test_a_worker_writes_its_own_ack_and_its_unit_state",
    "test_invalid_specs_are_rejected_with_a_clear_message",
    "test_key_mapping_fields_are_immutable",
    "test_placed_evenly_then_scaled_out_with_the_fewest_acknowledged_moves",
    "test_the_crds_take_a_server_side_apply_as_gitops_engines_make",
    "test_valid_objects_are_accepted_and_defaulted",
    "world",
]


@pytest.fixture(scope="module")
def oldest_kubernetes() -> Path:
    return ensure_tool(OLDEST_KUBERNETES)


@pytest.fixture(scope="module")
def dev_cluster(
    oldest_kubernetes: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevCluster]:
    with DevCluster.start(
        tmp_path_factory.mktemp("oldest") / "cluster", binaries=oldest_kubernetes
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def crds(dev_cluster: DevCluster) -> None:
    install_crds(dev_cluster)


def test_the_cluster_is_the_oldest_version(dev_cluster: DevCluster) -> None:
    said = dev_cluster.kubectl("version", "-o", "json").stdout
    assert '"gitVersion": "v1.30.' in said
