"""What every embedded service shares: ``start()`` and ``stop()``, and use as a context manager."""

from __future__ import annotations

from typing import Self


class EmbeddedService:
    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
