"""Everything that generates: the engine, models, and the Redis worker service."""

__all__ = ["LLM", "LLMEngine", "EngineConfig"]


def __getattr__(name):  # lazy: `import gpuworker.service...` should not load torch twice over
    if name == "LLM":
        from gpuworker.llm import LLM

        return LLM
    if name == "LLMEngine":
        from gpuworker.engine.llm_engine import LLMEngine

        return LLMEngine
    if name == "EngineConfig":
        from gpuworker.config import EngineConfig

        return EngineConfig
    raise AttributeError(name)
