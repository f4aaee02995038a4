# The native key kernel (_keys.c): <scheme>_unit(key, count) and <scheme>_units(keys, count, out)
# for the apportion, netherite and akka schemes; keys.py looks them up by scheme name.
from typing import Any

XXHASH_VERSION: int

def __getattr__(name: str) -> Any: ...
