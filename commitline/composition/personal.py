"""The operator's work on personal data, as ``Commitline`` does it for the CLI: erasing a data subject,
listing erasures, rotating the master key. ``PersonalDataOperations`` is a part of ``Commitline``
(``root.py``), over its datastore, settings and store."""

from __future__ import annotations

from commitline.application.boundary import check_tenant
from commitline.application.errors import ConfigurationError
from commitline.domain.errors import InvalidValue
from commitline.infrastructure.personal.keys import DataKeys, Erasure, Rotation
from commitline.infrastructure.personal.master import MasterKey

PREVIOUS = "COMMITLINE_PREVIOUS_MASTER_KEY"


class PersonalDataOperations:
    """Erasure and key rotation (a part of ``Commitline``)."""

    def data_keys(self) -> DataKeys:
        return DataKeys(self.datastore.get_connection, self.settings.schema_name)  # type: ignore[attr-defined]

    def erase(self, tenant: str, subject: str, *, by: str = "operator") -> list[Erasure]:
        """Delete the data key of ``subject`` (of ``tenant``) and record the erasure: from now on its personal
        values read as ERASED everywhere. This process forgets the key and every decoded aggregate at once, and
        so do other running processes when the erasure's notification reaches them (``erasure_watch.py``).
        [] when it has no key."""
        tenant = check_tenant(tenant)
        if not subject or not subject.strip():
            raise InvalidValue("subject", subject, "must name a data subject")
        done = self.data_keys().erase(tenant, subject, by)
        self.store.forget(e.key_id for e in done)  # type: ignore[attr-defined]
        return done

    def erasures(self, tenant: str | None = None) -> list[Erasure]:
        return self.data_keys().erased(check_tenant(tenant) if tenant is not None else None)

    def rotate_master_key(self, new_key: str | None = None) -> Rotation:
        """Rewrap every data key under ``new_key`` (base64 of 32 bytes) with the configured master key; then
        configure ``new_key`` as ``COMMITLINE_MASTER_KEY`` everywhere, and run it again to catch keys that
        processes still on the old key made meanwhile.

        Without ``new_key``, the second step of a rolling rotation: every data key still wrapped under
        ``COMMITLINE_PREVIOUS_MASTER_KEY`` is rewrapped under ``COMMITLINE_MASTER_KEY`` (processes configured
        with both wrap new keys under the current one only); then the previous key can be dropped."""
        master = self.store.codec.personal.master()  # type: ignore[attr-defined]  # checked against the table
        if new_key is None:
            if master.previous is None:
                raise ConfigurationError(PREVIOUS, "is not set, and no new master key was given: give the new key "
                                         "on standard input (or --new-key-env), or, in a rolling rotation, configure "
                                         "the old key as COMMITLINE_PREVIOUS_MASTER_KEY and the new one as "
                                         "COMMITLINE_MASTER_KEY; nothing was rewrapped")
            return self.data_keys().rewrap(master.previous, master.current)
        try:
            new = MasterKey.parse(new_key)
        except ValueError as e:
            raise ConfigurationError("the new master key", str(e)) from None
        return self.data_keys().rewrap(master.current, new)
