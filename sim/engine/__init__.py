"""One replica's engine as plain state and its SimPy process: scheduler, sequences, decode groups,
step pricing, and the replicas behind a router."""
