"""The local control plane: a real kube-apiserver, kube-controller-manager and etcd built from Go
modules, plus a pod simulator in place of kubelets. Used by `apportion dev-cluster`, the e2e
tests and the demo.

    from apportion.devcluster import DevCluster

    with DevCluster.start() as cluster:
        cluster.kubectl("get", "nodes")
"""

from apportion.devcluster.build import ensure_built
from apportion.devcluster.cluster import DevCluster, KubectlError
from apportion.devcluster.paths import DevClusterError
from apportion.devcluster.podsim.objects import SIMULATE_ANNOTATION

__all__ = ["SIMULATE_ANNOTATION", "DevCluster", "DevClusterError", "KubectlError", "ensure_built"]
