"""Everything that generates: the engine, models, and the Redis worker service."""

__all__ = ["LLM", "LLMEngine", "EngineConfig"]


def __getattr__(name):  # lazy: `import inferq.gpuworker.service...` should not load torch twice over
    if name == "LLM":
        from inferq.gpuworker.llm import LLM

        return LLM
    if name == "LLMEngine":
        from inferq.gpuworker.engine.llm_engine import LLMEngine

        return LLMEngine
    if name == "EngineConfig":
        from inferq.gpuworker.config import EngineConfig

        return EngineConfig
    raise AttributeError(name)
