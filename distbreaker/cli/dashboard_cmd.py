"""`distbreaker dashboard`: serve the live web dashboard (extra ``distbreaker[dashboard]``)."""

from __future__ import annotations

import secrets

import click

from .app import App, Failure, cli, connect, redact


@cli.command("dashboard")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port (0: any free one).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 exposes it to the network).")
@click.option("--refresh", default=2.0, show_default=True, type=click.FloatRange(0.2, 60),
              help="Seconds between fleet reads (transitions are pushed at once anyway).")
@click.option("--allow-actions", is_flag=True,
              help="Enable operator actions (open, close, reset, ...) behind a bearer token.")
@click.option("--token", envvar="DISTBREAKER_DASHBOARD_TOKEN", show_envvar=True,
              help="The bearer token for actions (default: a random one, printed at start).")
@click.pass_obj
def dashboard_command(app: App, port: int, host: str, refresh: float, allow_actions: bool,
                      token: str | None) -> None:
    """Serve a live web dashboard of every breaker, bulkhead and retry budget.

    Read-only by default. With --allow-actions, actions need the bearer token and
    are recorded in the history with the actor and reason given on the page.
    Ctrl-C stops it and exits 0.
    """
    try:
        import uvicorn

        from ..dashboard import Dashboard, create_app
    except ImportError as exc:
        raise Failure(f"the dashboard needs its extra: pip install 'distbreaker[dashboard]' "
                      f"({exc})") from None
    app.client.ping()  # fail now, with the CLI's one-line error, if Redis is not there
    if allow_actions and not token:
        token = secrets.token_urlsafe(24)
        click.echo(f"operator actions enabled; bearer token: {token}", err=True)
    url = app.url
    dashboard = Dashboard(lambda: connect(url), app.prefix, refresh=refresh,
                          allow_actions=allow_actions, token=token)
    mode = "operator actions enabled" if allow_actions else "read-only"
    config = uvicorn.Config(create_app(dashboard), host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=1, lifespan="on")
    try:
        sock = config.bind_socket()  # bound here, so the line below names the real port
    except OSError as exc:
        raise Failure(f"cannot listen on {host}:{port}: {exc}") from None
    bound = sock.getsockname()[1]
    where = f"[{host}]" if ":" in host else host
    click.echo(f"distbreaker dashboard for {redact(url)} (prefix {app.prefix!r}, {mode}) "
               f"on http://{where}:{bound}/", err=True)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled: a normal stop
        pass
    finally:
        sock.close()
    click.echo("distbreaker dashboard stopped", err=True)
