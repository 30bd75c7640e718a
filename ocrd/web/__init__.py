"""The HTTP side: the server (`server`), the documents API (`api`, `openapi`), the status
page (`statuspage`), metrics (`metrics`), recent activity (`activity`), and the client that
`ocrd status` uses (`client`)."""
