"""The HTTP side: the server (`server`), the documents API (`api`, `openapi`; what became of
a document in `documents`, its files served by `served`), the status page (`statuspage`),
metrics (`metrics`), recent activity (`activity`), and the client that `ocrd status` uses
(`client`)."""
