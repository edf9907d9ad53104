"""OpenAI-compatible serving: HTTP server and AsyncLLM in the main process, engine in its own.

The HTTP side (`http_server`, `async_llm`) never runs the model; the engine process
(`engine_process`) never imports FastAPI. They talk over ZMQ with msgpack (`ipc`).
"""
