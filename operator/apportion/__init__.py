"""apportion: declarative placement of grains, partitions and shards on Kubernetes worker pods."""

GROUP = "apportion.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

__version__ = "0.1.0"
