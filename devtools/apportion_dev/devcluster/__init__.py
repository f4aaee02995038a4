"""The local control plane: a real kube-apiserver, kube-controller-manager and etcd built from Go
modules, plus a pod simulator in place of kubelets. Used by `apportion dev-cluster`, the e2e
tests and the demo.

    from apportion_dev.devcluster import DevCluster

    with DevCluster.start() as cluster:
        cluster.kubectl("get", "nodes")
"""

from apportion_dev.devcluster.build import ensure_built
from apportion_dev.devcluster.cluster import DevCluster, KubectlError
from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.podsim.objects import SIMULATE_ANNOTATION

__all__ = ["SIMULATE_ANNOTATION", "DevCluster", "DevClusterError", "KubectlError", "ensure_built"]
