"""The message bus seam: protocol (base), topic names (topics), MQTT and in-memory implementations."""

from ftd.bus.base import Bus, BusUnavailable, LastWill, Message

__all__ = ["Bus", "BusUnavailable", "LastWill", "Message"]
