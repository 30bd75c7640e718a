"""Intake: what people and scanners hand over becomes a claimed job. Watching the inboxes
(`watch`, and `mounts` for the filesystem an inbox is on), pairing duplex scans
(`collate`), claiming a quiet file into the work area (`claiming`) as a claim (`claim`),
the inboxes being served (`inboxes`), uploads over HTTP written into an inbox (`uploads`,
`receiving`), and several daemons sharing one inbox under leases (`instances`, `leases`,
`lease_folder`)."""
