"""`tensortune serve`: the REST API and the job runner in one process (uvicorn)."""
from __future__ import annotations

import ipaddress
import logging
import os
from typing import Optional

import typer

from .cli_args import DB_OPTION, WORKERS_HELP, check_workers, console, open_database
from .measurers import default_workers

CLIENT_TRIALS = 64  # ClientJobs.trials, said again: importing db here would slow every command (a test holds them equal)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(host: str = typer.Option("127.0.0.1", "--host"),
          port: int = typer.Option(8000, "--port", min=1, max=65535),
          db: Optional[str] = DB_OPTION,
          workers: str = typer.Option(default_workers(), "--workers", help=WORKERS_HELP),
          runners: int = typer.Option(1, "--runners", min=1, help="jobs tuned at once"),
          client_jobs: bool = typer.Option(True, "--client-jobs/--no-client-jobs",
                                           help="queue a tuning job for each workload a client reports building "
                                                "without a config (POST /api/requests)"),
          client_trials: int = typer.Option(CLIENT_TRIALS, "--client-trials", min=1, max=100_000,
                                            help="the budget of each job queued for clients")):
    """Serve the API and run queued jobs; TENSORTUNE_TOKEN guards every POST."""
    import uvicorn

    from db.client_requests import ClientJobs

    from .api import create_app
    from .runner import Runner, RunnerOptions

    token = os.environ.get("TENSORTUNE_TOKEN") or None
    if not token and not is_loopback(host):
        raise typer.BadParameter(f"refusing to listen on {host} without TENSORTUNE_TOKEN set", param_hint="--host")
    check_workers(workers)
    said = logging.StreamHandler()  # what the runners wait for and why jobs failed, beside uvicorn's lines
    said.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("tensortune").addHandler(said)
    logging.getLogger("tensortune").setLevel(logging.INFO)
    database = open_database(db)
    runner = Runner(database, RunnerOptions(threads=runners, workers=workers))
    jobs = ClientJobs(trials=client_trials) if client_jobs else None
    server = quiet_shutdown(uvicorn.Config(create_app(database, runner, token, jobs), host=host, port=port,
                                           log_level="info"))
    try:
        server.run()
    except KeyboardInterrupt:  # the Ctrl-C it shut down for, raised again once it has: a stop as asked (exit 0)
        pass
    console.print("stopped: any job it was running is queued again, to resume when a service starts")


def quiet_shutdown(config):
    """A uvicorn server that stops (Ctrl-C, SIGTERM) without its four lines of shutdown: `serve` says it in one.
    Its warnings and errors still show."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
            await super().shutdown(sockets)

    return Server(config)


def register(app: typer.Typer) -> None:
    app.command()(serve)
