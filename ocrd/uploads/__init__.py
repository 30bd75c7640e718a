"""Files handed over by HTTP: an upload is written into an upload folder of its own in its
inbox with a record of who sent it (`receiving`), found and tidied there (`uploads`), and
a docling-serve task keeps its options beside its upload (`tasks`). Intake then claims the
upload like any dropped file."""
