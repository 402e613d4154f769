"""The domain's process managers (sagas) as ``Commitline`` builds them: each with its ports' adapters (made by
the domain's factories), the follower that runs one over the log, and the instances waiting for a person.

``Sagas`` is a part of ``Commitline`` (``root.py``): its methods use the root's settings, processor, store,
codec, recorder, connection parameters, datastore and domain."""

from __future__ import annotations

import sysconfig
import traceback
from collections.abc import Mapping
from typing import Any

from commitline.application.errors import CommitlineError, ConfigurationError
from commitline.application.process import ProcessManager, StuckInstance
from commitline.composition.errors import UnknownProcessManager
from commitline.framework.domain import PortContext
from commitline.infrastructure.config import hide_secrets
from commitline.infrastructure.sagas.runner import ProcessRunner
from commitline.projections.storage import table_exists


def _where(error: BaseException) -> str:
    """file:line of the innermost frame of ``error``'s traceback outside installed packages and the standard
    library (the domain's own line that led to it), else the innermost one."""
    frames = traceback.extract_tb(error.__traceback__)
    stdlib = sysconfig.get_paths()["stdlib"]
    own = [f for f in frames if "-packages" not in f.filename and not f.filename.startswith(stdlib)]
    frame = (own or frames or [None])[-1]
    return f"at {frame.filename}:{frame.lineno}" if frame is not None else "no traceback"


class Sagas:
    """Building and running the domain's process managers (a part of ``Commitline``)."""

    def stuck_sagas(self, tenant: str | None = None) -> list[StuckInstance]:
        """Every process manager's instances waiting for a person (of ``tenant``, or of every tenant); none
        from one whose read models have not been built yet."""
        stuck: list[StuckInstance] = []
        reads = self.read_models()
        for name, cls in sorted(self.domain.managers.items()):
            with self.datastore.get_connection() as conn:
                built = all(table_exists(conn, self.datastore.schema, self.projection(model))
                            for model in cls.read_models)
            if built:
                stuck += self._manager_base(cls).stuck(reads, tenant)
        return stuck

    def port(self, name: str) -> Any:
        """The adapter of the domain's port ``name``, made by its factory now (ConfigurationError if it cannot)."""
        factories = self.domain.port_factories
        if name not in factories:
            raise ConfigurationError("COMMITLINE_APP", f"the domain {self.domain.name} declares no port {name!r} "
                                     f"(it has: {', '.join(sorted(factories)) or 'none'})")
        try:
            return factories[name](PortContext(self.settings, self.conninfo))
        except CommitlineError:
            raise
        except Exception as e:  # the domain's own code: said as configuration, where it failed, no secret in it
            told = hide_secrets(f"{type(e).__name__}: {e}", self.settings, [str(self.conninfo.get("password") or "")])
            raise ConfigurationError("COMMITLINE_APP", f"the factory of the domain {self.domain.name}'s port {name!r} "
                                     f"raised {told} ({_where(e)}); it is called with a PortContext: settings, and "
                                     f"conninfo, psycopg.connect's keyword arguments") from None

    def process_manager(self, name: str | None = None, *, ports: Mapping[str, Any] | None = None,
                        **options: Any) -> ProcessManager:
        """The domain's process manager ``name`` (the only one when None) over this processor and store. Each
        port it has no adapter for in ``ports`` is made by the domain's factory; ``attempts`` and ``backoff``
        default to ``COMMITLINE_GATEWAY_ATTEMPTS`` and ``COMMITLINE_GATEWAY_BACKOFF_MS``."""
        cls = self._manager_class(name)
        given = dict(ports or {})
        adapters = {port: given.pop(port) if port in given else self.port(port) for port in self.domain.port_factories}
        adapters.update(given)
        options.setdefault("attempts", self.settings.gateway_attempts)
        options.setdefault("backoff", self.settings.gateway_backoff_ms / 1000)
        return cls(self.processor, self.store, adapters, **options)

    def process_runner(self, manager: ProcessManager | str | None = None, **options: Any) -> ProcessRunner:
        """The follower that runs ``manager`` (an instance, or the name of one to build) over the log."""
        if not isinstance(manager, ProcessManager):
            manager = self.process_manager(manager)
        return ProcessRunner(manager, self.codec, self.recorder, self.conninfo, **options)

    def _manager_class(self, name: str | None) -> type[ProcessManager]:
        managers = self.domain.managers
        if not managers:
            raise UnknownProcessManager(name or "", managers, self.domain.name)
        if name is None and len(managers) == 1:
            return next(iter(managers.values()))
        if name is None or name not in managers:
            raise UnknownProcessManager(name or "", managers)
        return managers[name]

    def _manager_base(self, cls: type[ProcessManager] = ProcessManager) -> ProcessManager:
        """A process manager without ports: enough for what the CLI and status ask of it (``stuck``,
        ``instances``, ``retry``, ``history_of``), which never calls an external system."""
        return cls(self.processor, self.store)

    def saga(self, name: str | None = None) -> ProcessManager:
        """The process manager ``name`` (the only one when None) for the operator's questions: its instances,
        one instance's history, a retry; UnknownProcessManager when the domain has no such one."""
        return self._manager_base(self._manager_class(name))
