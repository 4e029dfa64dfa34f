"""Generic weight loading shared by the model families: ``checkpoint`` (read a file safely, strip its
wrappers, hand it to the model's own adapter), ``loading`` (``load_weights``, the one entry point, plain or
ZeRO-3 partitioned; a recipe's ``load_and_report``), ``sharded`` (the partitioned copy), ``report``
(``LoadReport``, the backbone coverage, the weights' normalisation) and ``hf_config``. Each family's format
adapter is its own ``weights`` module; each declares its formats' normalisation (``FORMAT_MEAN_STD``)."""
