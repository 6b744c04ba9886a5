"""The jobs of the response database, one module each; ``service/database.py`` composes them.

A record's way: ``ResponseStore.put`` (as started) and ``settled`` (as ended) queue it with
``database.write``; the writer thread (``writer.py``) builds its row and commits the batch,
then drops it from ``pending``. The store is never told: a read that misses memory asks
``database.pending(id)`` first (a queued or failing write holds the record, a queued delete
hides the row) and only then reads the file (``reads.py``).
Why this round trip stays: the store evicts by its own bounds without waiting for the disk,
so until the commit (or while a full disk fails it) the queued write is the only copy of an
evicted record; telling the store instead would put a lock in it and pin unwritten records
past its bounds. ``schema.py``: the table and migrations; ``recovery.py``: owners and crash
recovery; ``retention.py``: deletes and what is forgotten by age or size.
"""
