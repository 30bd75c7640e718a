"""Several daemons sharing one inbox: each daemon's instance name and its leases in the
work areas it serves (`instances`), the lease files and the moves on them (`leases`,
`lease_folder`), and what a claim needs of all this (`tenure`)."""
