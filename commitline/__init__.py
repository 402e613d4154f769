"""commitline: an event-sourced command processor for systems where a wrong state costs money."""

__version__ = "0.1.0"
