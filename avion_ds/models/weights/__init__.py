"""Generic weight loading shared by the model families: ``loading`` (read a file safely, unwrap, hand it
to the model's own adapter, load and report), ``report`` (``LoadReport``) and ``sharded`` (loading into
ZeRO-3 partitioned models). Each family's format adapter is its own ``weights`` module."""
