"""apportion: declarative placement of grains, partitions and shards on Kubernetes worker pods."""

import importlib.metadata

GROUP = "apportion.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The installed distribution's version, which setuptools read from the repository's VERSION.
__version__ = importlib.metadata.version("apportion")
