"""One domain in three releases: ``v1`` writes ``NoteWritten`` events at class version 1, ``v2`` ships version 2
(the text split into a title and a body) with its upcaster, ``v3_broken`` ships version 3 with an upcaster from
2 only, so the version-1 events it finds in a store have no way to its shape."""
