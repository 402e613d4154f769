"""Personal data at rest: the master key (``master.py``), the data keys of each (tenant, data subject) and the
record of erasures (``keys.py``), sealing personal field values with them (``cipher.py``), and idempotency
records' stored outcomes (those from before migration 14) and snapshots kept without plain text (``outcomes.py``,
``snapshots.py``).

Each personal value is encrypted with AES-GCM under its subject's data key, a random 96-bit nonce per value,
with associated data binding the tenant, the subject, the event id and the field, so a ciphertext cannot be
moved to another event, field, subject or tenant. Data keys are stored wrapped (AES-GCM) under the master key
from ``COMMITLINE_MASTER_KEY`` (during a rolling rotation, the previous one beside it). Erasing a subject deletes
its data key: its ciphertext, wherever it went, cannot be read again, and the hash chains over the stored bytes
stay intact. Every running process hears of an erasure and forgets the key at once (``erasure_watch.py``).
"""
