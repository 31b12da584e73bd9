"""The job runner, the REST API, the dashboard and the tensortune CLI."""
