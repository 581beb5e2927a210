"""The read-only web console (issue 14): `app.Console` over the services, `server.ConsoleServer`
to serve it on ``VIDROUTE_CONSOLE_LISTEN``; templates and the vendored htmx beside them."""
