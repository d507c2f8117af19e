"""The FastAPI application: wiring only (routes live in *_routes.py)."""
from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager
from typing import Optional

from fastapi import FastAPI

from producer.settings import ProducerSettings

from producer.gateway import health_routes, jobs_routes, openai_routes
from producer.gateway.backend import Backend
from producer.gateway.config import GatewaySettings, check_exposure, parse_api_keys
from producer.gateway.errors import install_error_handlers
from producer.gateway.limits import BodySizeLimit
from producer.gateway.readers import ReaderLimit
from producer.gateway.metrics import GatewayMetrics, RequestMetrics
from producer.gateway.runner import Context


def create_app(settings: Optional[GatewaySettings] = None,
               producer_settings: Optional[ProducerSettings] = None) -> FastAPI:
    settings = settings or GatewaySettings()
    producer_settings = producer_settings or ProducerSettings()
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # A bounded pool: one connection per open stream plus room for the rest.
        backend = Backend(producer_settings, max_connections=settings.max_streams + 64)
        app.state.ctx = Context(backend=backend, settings=settings,
                                default_model=producer_settings.default_model, metrics=metrics)
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(title="inferq gateway", version="0.1.0", lifespan=lifespan)
    app.state.api_keys = parse_api_keys(settings)
    check_exposure(settings, app.state.api_keys)
    install_error_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(jobs_routes.router)
    app.include_router(health_routes.router)
    if not settings.metrics_port:
        app.include_router(health_routes.metrics_router)
    # The last added is the outermost: metrics see every response, 413s included.
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(ReaderLimit, total=settings.max_streams, per_tenant=settings.max_streams_per_tenant)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def create_metrics_app(app: FastAPI) -> FastAPI:
    """/metrics alone, sharing ``app``'s state (its context is made by ``app``'s lifespan)."""
    side = FastAPI(title="inferq gateway metrics", openapi_url=None, docs_url=None, redoc_url=None)
    side.state = app.state
    side.include_router(health_routes.metrics_router)
    return side


def serve(settings: Optional[GatewaySettings] = None, log_level: str = "info") -> None:
    """Run the gateway with uvicorn (blocks); with ``metrics_port`` a second
    listener in the same event loop serves /metrics off the public port."""
    import asyncio

    import uvicorn

    settings = settings or GatewaySettings()
    try:
        app = create_app(settings)
    except ValueError as e:  # a configuration the operator must fix: one line, no traceback
        raise SystemExit(f"inferq gateway: {e}") from None
    # Access logs carry paths only (never bodies), so prompts stay out of logs.
    main = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                                         access_log=True, timeout_graceful_shutdown=5))
    if not settings.metrics_port:
        main.run()
        return

    class SideServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # the main server owns SIGINT/SIGTERM
            yield

    side = SideServer(uvicorn.Config(create_metrics_app(app), host=settings.metrics_host, port=settings.metrics_port,
                                     log_level=log_level, access_log=False, lifespan="off"))

    async def both() -> None:
        task = asyncio.create_task(side.serve())
        try:
            await main.serve()
        finally:
            side.should_exit = True
            await task

    asyncio.run(both())
