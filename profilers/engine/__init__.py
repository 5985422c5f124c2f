"""A real serving engine, vLLM's CPU build, driven by the project as a separate program.

The engine lives in a venv of its own (it pins its own torch); the project starts its
OpenAI-compatible server on 127.0.0.1 from that venv's Python and talks to it over HTTP and
/metrics only, never importing vllm. Modules: install (the venv), export (a checkpoint in the
layout the engine loads), server (start, health, stop), load (requests played against it),
scrape (/metrics), steps (step costs measured through the engine) and runs (a measurement
written as data-contract rows)."""
