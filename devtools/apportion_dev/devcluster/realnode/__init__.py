"""A real Kubernetes node beside the dev-cluster's control plane: containerd, runc, the kubelet,
kube-scheduler, kube-proxy and metrics-server, running real containers from images built here.
"""
