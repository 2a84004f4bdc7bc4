"""``--accumulate`` / ``--alpha`` / ``--beta``: ``C ← α·A·B + β·C``. The flags and C checked before
any work (``flags``), the state beside C's chunks that makes it happen exactly once (``state``), and
the worker's side of each tile (``tasks``)."""
