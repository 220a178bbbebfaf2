"""The service shell: the `geoingest` command (cli.py), settings, metrics and health, the Spark session, the wiring
of the job (service.py), many tables from one service (routing.py); the local stack the demo and tests start is apart, in app/local/."""
