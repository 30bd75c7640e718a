"""Intake: what people and scanners hand over becomes a claimed job. Watching the inboxes
(`watch`, and `mounts` for the filesystem an inbox is on), pairing duplex scans
(`collate`), claiming a quiet file into the work area (`claiming`) as a claim (`claim`),
and the inboxes being served (`inboxes`). Uploads over HTTP arrive through
`ocrd/uploads/`; several daemons share an inbox through `ocrd/sharing/`."""
