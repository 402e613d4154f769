"""The append-only PostgreSQL event store: schema, recorder and gap-safe log, codec, audit source, retention."""
