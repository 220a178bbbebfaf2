"""The service shell: the `geoingest` command (cli.py), settings, metrics and health, the Spark session, the wiring
of the job (service.py) and its reading of the query's progress (progress.py), many tables from one service (routing.py, split_lane.py for a topic split over tables); the local stack the demo and tests start is apart, in app/local/."""
