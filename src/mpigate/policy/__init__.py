"""The rule catalogue's checks: pure evaluation of TrainJobs and runtimes into a ``Decision``."""
