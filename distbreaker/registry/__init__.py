"""Named components built from a configuration file, a mapping or the environment."""

from .config import RegistryConfigError, RegistrySpec
from .health import ComponentHealth, RegistryHealth, health
from .sync import Registry

__all__ = ["ComponentHealth", "Registry", "RegistryConfigError", "RegistryHealth",
           "RegistrySpec", "health"]
