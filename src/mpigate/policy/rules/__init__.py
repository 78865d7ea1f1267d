"""One module per rule family of the catalogue; each check yields "
":class:`~mpigate.policy.findings.Finding` values."""
