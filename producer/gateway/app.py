"""The FastAPI application: wiring only (routes live in *_routes.py)."""
from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Optional

from fastapi import FastAPI

from inferq.producer.settings import ProducerSettings

from inferq.producer.gateway import batch_routes, files_routes, health_routes, jobs_routes, openai_routes
from inferq.producer.gateway import embeddings_routes, tokenize_routes
from inferq.producer.gateway import responses_routes
from inferq.producer.gateway.responses_state import ResponsesService
from inferq.producer.gateway.responses_store import ResponseStore
from inferq.producer.gateway.backend import Backend
from inferq.producer.gateway.batch_driver import BatchManager
from inferq.producer.gateway.batch_store import BatchStore
from inferq.producer.gateway.files_store import FilesStore
from inferq.producer.gateway.config import (GatewaySettings, check_exposure, parse_api_keys, parse_dashboard_keys,
                                     worker_metrics_urls)
from inferq.producer.gateway.errors import install_error_handlers
from inferq.producer.gateway.limits import BodySizeLimit
from inferq.producer.gateway.readers import ReaderLimit
from inferq.producer.gateway.metrics import GatewayMetrics, RequestMetrics
from inferq.producer.gateway.runner import Context
from inferq.producer.gateway.dashboard.sampler import Sampler
from inferq.producer.gateway import webhooks
from inferq.producer.gateway.webhooks import routes as webhook_routes
from inferq.producer.gateway.webhooks.endpoints import parse_config as parse_webhooks


@dataclass
class BatchService:
    """What the Files and Batch routes share: the files directory, the batch records, the driver."""

    files: FilesStore
    store: BatchStore
    manager: BatchManager


def create_app(settings: Optional[GatewaySettings] = None,
               producer_settings: Optional[ProducerSettings] = None) -> FastAPI:
    settings = settings or GatewaySettings()
    producer_settings = producer_settings or ProducerSettings()
    metrics = GatewayMetrics()
    configured_webhooks = parse_webhooks(settings.webhooks)  # a bad setting stops the start, with its reason

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # A bounded pool: one connection per open stream plus room for the rest.
        backend = Backend(producer_settings, max_connections=settings.max_streams + 64)
        app.state.ctx = Context(backend=backend, settings=settings,
                                default_model=producer_settings.default_model, metrics=metrics)
        files = FilesStore(settings.files_dir, settings.files_max_bytes)
        store = BatchStore(backend.redis)
        manager = BatchManager(app.state.ctx, files, store)
        app.state.batch = BatchService(files, store, manager)
        manager.start()  # resumes the batches no live gateway is driving
        app.state.responses = ResponsesService(app.state.ctx, ResponseStore(
            backend.redis, settings.responses_ttl_s, settings.responses_max_per_tenant))
        app.state.responses.start()  # saves ended responses before their reply streams expire
        # Samples only while someone watches the dashboard (dashboard/sampler.py).
        app.state.dashboard_sampler = Sampler(app.state.ctx, worker_metrics_urls(settings),
                                              settings.dashboard_sample_s, settings.dashboard_window_s)
        app.state.dashboard_sampler.start()
        if settings.webhooks_enabled:  # the dispatcher runs beside the requests, never on their path
            app.state.webhooks = webhooks.create_service(backend.redis, settings, configured_webhooks, metrics)
            app.state.webhooks.dispatcher.start()
        try:
            yield
        finally:
            if settings.webhooks_enabled:
                await app.state.webhooks.dispatcher.stop()
            await app.state.dashboard_sampler.stop()
            await app.state.responses.stop()
            await manager.stop()
            await backend.close()

    app = FastAPI(title="inferq gateway", version="0.1.0", lifespan=lifespan)
    app.state.api_keys = parse_api_keys(settings)
    app.state.dashboard_keys = parse_dashboard_keys(settings)
    check_exposure(settings, app.state.api_keys)
    install_error_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(jobs_routes.router)
    app.include_router(embeddings_routes.router)
    app.include_router(tokenize_routes.router)
    app.include_router(files_routes.router)
    app.include_router(batch_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(health_routes.router)
    app.include_router(webhook_routes.router)
    if settings.dashboard:
        from inferq.producer.gateway import dashboard

        app.include_router(dashboard.router)
    if not settings.metrics_port:
        app.include_router(health_routes.metrics_router)
    # The last added is the outermost: metrics see every response, 413s included.
    # An upload may be as large as a file may be (plus the multipart framing).
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       overrides={"/v1/files": settings.files_max_bytes + 65_536})
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

    # The loop uvicorn itself would run (uvloop where installed).
    factory = main.config.get_loop_factory() if hasattr(main.config, "get_loop_factory") else None
    if factory is None or not hasattr(asyncio, "Runner"):  # Python 3.10, older uvicorn
        asyncio.run(both())
        return
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(both())
