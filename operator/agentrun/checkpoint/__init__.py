"""Checkpoints of runs: ``schema`` (the stored models), ``migrations`` (older schema versions),
``fold`` (pure state transition), ``store`` (the S3 store), ``errors`` and ``trace`` (per-lap trace;
the ``agentrun trace`` command is ``agentrun.cli.trace``). Import the modules directly; this package imports nothing so that
importing the schema does not pull in boto3."""
