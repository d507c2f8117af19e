"""The FastAPI application: wiring only (routes live in *_routes.py)."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Optional

from fastapi import FastAPI

from producer.settings import ProducerSettings

from producer.gateway import health_routes, jobs_routes, openai_routes
from producer.gateway.backend import Backend
from producer.gateway.config import GatewaySettings, parse_api_keys
from producer.gateway.errors import install_error_handlers
from producer.gateway.limits import BodySizeLimit
from producer.gateway.metrics import GatewayMetrics, RequestMetrics
from producer.gateway.runner import Context


def create_app(settings: Optional[GatewaySettings] = None,
               producer_settings: Optional[ProducerSettings] = None) -> FastAPI:
    settings = settings or GatewaySettings()
    producer_settings = producer_settings or ProducerSettings()
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        backend = Backend(producer_settings)
        app.state.ctx = Context(backend=backend, settings=settings,
                                default_model=producer_settings.default_model, metrics=metrics)
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(title="inferq gateway", version="0.1.0", lifespan=lifespan)
    app.state.api_keys = parse_api_keys(settings)
    install_error_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(jobs_routes.router)
    app.include_router(health_routes.router)
    # The last added is the outermost: metrics see every response, 413s included.
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def serve(settings: Optional[GatewaySettings] = None, log_level: str = "info") -> None:
    """Run the gateway with uvicorn (blocks)."""
    import uvicorn

    settings = settings or GatewaySettings()
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level,
                # Access logs carry paths only (never bodies), so prompts stay out of logs.
                access_log=True, timeout_graceful_shutdown=5)
