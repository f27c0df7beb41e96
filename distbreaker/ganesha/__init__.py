"""Ganesha mode: a breaker that shares Ganesha's (PHP) Redis keys and semantics."""

from .config import GaneshaConfig, GaneshaEvent
from .core import GaneshaReply
from .sync import GaneshaBreaker

__all__ = ["GaneshaBreaker", "GaneshaConfig", "GaneshaEvent", "GaneshaReply"]
