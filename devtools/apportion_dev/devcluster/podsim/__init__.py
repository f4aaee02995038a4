"""Pod simulator: binds pods to simulated nodes and plays their kubelet (see simulator.py).

Runs inside every dev-cluster; standalone against any cluster without kubelets:
`python -m apportion_dev.devcluster.podsim --kubeconfig PATH --state-dir DIR`.
"""

from apportion_dev.devcluster.podsim.objects import SIMULATE_ANNOTATION
from apportion_dev.devcluster.podsim.simulator import PodSimulator, pod_log_path

__all__ = ["SIMULATE_ANNOTATION", "PodSimulator", "pod_log_path"]
